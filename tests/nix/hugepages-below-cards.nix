# A host that reserves fewer 1 GiB hugepages than its models' cards: the
# module still evaluates (the engine says what it lacks) but warns, saying
# what to set. run.sh checks the warning; the default would be 4 per card.
{
  imports = [ ../../examples/tp2-two-cards.nix ];
  services.tenstorrent-serving.hugepages.count = 1;
}
