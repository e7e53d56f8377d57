# Self-test of toml.nix: awkward keys and strings, nesting, lists of lists
# and of inline tables. run.sh parses `rendered` with Python's tomllib and
# compares the result with `value`.
let
  toml = import ./toml.nix;
  value = {
    plain = "text";
    "dotted.key" = "needs quotes";
    "with space" = 1;
    escapes = "quote \" backslash \\ newline \n tab \t unicode é";
    int = -42;
    float = 1.5;
    yes = true;
    no = false;
    empty_list = [ ];
    strings = [
      "a"
      "b"
    ];
    nested_lists = [
      [ "0000:01:00.0" ]
      [
        2
        3
      ]
    ];
    inline_tables = [
      {
        a = 1;
        "b c" = "d";
      }
    ];
    empty_table = { };
    only_tables.inner.leaf = "deep";
    models."qwen3.6-27b" = {
      tp = 2;
      flags.QWEN36_SDPA_STREAMING = "1";
      readiness.expect = "Paris";
    };
  };
in
{
  inherit value;
  rendered = toml.render value;
}
