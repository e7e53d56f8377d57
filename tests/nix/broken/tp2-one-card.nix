# expect: services.tenstorrent-serving.models.qwen.cards: tp = 2 needs exactly 2 cards, got 1 ([ "0000:01:00.0" ]). Add the cabled partner card or set tp = 1.
{
  services.tenstorrent-serving = {
    enable = true;
    models.qwen = {
      tp = 2;
      cards = [ "0000:01:00.0" ];
      checkpoint = "/srv/models/Qwen3.6-27B";
    };
  };
}
