# expect: services.tenstorrent-serving.tls: set both certFile and keyFile for TLS on the public port, or neither for plaintext.
{
  services.tenstorrent-serving = {
    enable = true;
    tls.certFile = "/var/lib/acme/llm.example.org/fullchain.pem";
    models.smollm2 = {
      tp = 1;
      cards = [ 0 ];
      checkpoint = "/var/lib/tt-serving/models/smollm2.gguf";
    };
  };
}
