# expect: models.qwen.cards: TP=2 needs exactly 2 cards, got 1 ([0000:01:00.0])
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
