# A small pure-Nix TOML writer for the harness only: the module itself uses
# `(pkgs.formats.toml { }).generate`, which needs a Nix store (remarshal).
# Enough for the daemon's schema: tables and nested tables, strings, paths,
# integers, floats, booleans, lists (of scalars, of lists, of inline
# tables). Nulls are an error: the module must have removed them.
let
  inherit (builtins)
    attrNames
    concatStringsSep
    filter
    isAttrs
    isBool
    isFloat
    isInt
    isList
    isPath
    isString
    match
    toJSON
    typeOf
    ;

  showPath = path: concatStringsSep "." path;

  # Bare keys where TOML allows them, else a basic (quoted) string.
  key = k: if match "[A-Za-z0-9_-]+" k != null then k else toJSON k;

  # JSON's string escapes (\" \\ \n \t \uXXXX) are valid in TOML basic strings.
  value =
    path: v:
    if isString v || isPath v then
      toJSON (toString v)
    else if isBool v then
      (if v then "true" else "false")
    else if isInt v then
      toString v
    else if isFloat v then
      toString v
    else if isList v then
      "[" + concatStringsSep ", " (map (value path) v) + "]"
    else if isAttrs v then
      "{ "
      + concatStringsSep ", " (map (n: "${key n} = ${value (path ++ [ n ]) v.${n}}") (attrNames v))
      + " }"
    else if v == null then
      throw "toml.nix: null at `${showPath path}`; TOML has no null, remove the key"
    else
      throw "toml.nix: cannot write a ${typeOf v} at `${showPath path}`";

  table =
    path: attrs:
    let
      names = attrNames attrs;
      sub = filter (n: isAttrs attrs.${n}) names;
      plain = filter (n: !(isAttrs attrs.${n})) names;
      # A table holding only tables needs no header of its own.
      header =
        if path == [ ] || (plain == [ ] && sub != [ ]) then
          ""
        else
          "\n[${concatStringsSep "." (map key path)}]\n";
    in
    header
    + concatStringsSep "" (map (n: "${key n} = ${value (path ++ [ n ]) attrs.${n}}\n") plain)
    + concatStringsSep "" (map (n: table (path ++ [ n ]) attrs.${n}) sub);
in
{
  # The TOML text of an attribute set.
  render = attrs: table [ ] attrs;
}
