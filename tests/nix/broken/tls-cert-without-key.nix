# expect: services.tenstorrent-serving.tls: set both certFile and keyFile for TLS on the public port, or neither for plaintext.
{
  imports = [ ../../../examples/minimal.nix ];
  services.tenstorrent-serving.tls.certFile = "/var/lib/acme/llm.example.org/fullchain.pem";
}
