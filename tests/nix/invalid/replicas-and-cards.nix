# expect: models.smollm2.replicas: give either `cards` (one replica) or `replicas` (several), not both
{
  services.tenstorrent-serving = {
    enable = true;
    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      replicas = [ [ 1 ] [ 2 ] ];
      checkpoint = "/var/lib/tt-serving/models/smollm2.gguf";
    };
  };
}
