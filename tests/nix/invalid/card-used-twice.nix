# expect: models.b.cards[0]: card 0000:01:00.0 is already used by models.a.cards[0]; a card can belong to one slot only
{
  services.tenstorrent-serving = {
    enable = true;
    models.a = {
      tp = 1;
      cards = [ "0000:01:00.0" ];
      checkpoint = "/var/lib/tt-serving/models/a.gguf";
    };
    # The same card, written without the PCI domain.
    models.b = {
      tp = 1;
      cards = [ "01:00.0" ];
      checkpoint = "/var/lib/tt-serving/models/b.gguf";
    };
  };
}
