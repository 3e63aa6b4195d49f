"""A script carried by a C++ binary as a raw string: a header of one constant."""

def script_header(name, src, out, constant, namespace, guard):
    """Writes `out`, defining `namespace::constant` as the text of `src`.

    The build fails if the script holds the raw string's closing delimiter.
    """
    native.genrule(
        name = name,
        srcs = [src],
        outs = [out],
        cmd = """
if grep -qF ')PY"' $<; then
  echo "$<" 'holds )PY", which would end the raw string that carries it' >&2
  exit 1
fi
{{
  echo '// Generated from $< by //{pkg}:{name}: do not edit.'
  echo '#ifndef {guard}'
  echo '#define {guard}'
  echo 'namespace {ns} {{'
  echo '// The script, after a leading newline.'
  echo 'inline constexpr char {constant}[] = R"PY('
  cat $<
  echo ')PY";'
  echo '}}  // namespace {ns}'
  echo '#endif  // {guard}'
}} > $@
""".format(pkg = native.package_name(), name = name, guard = guard, ns = namespace,
           constant = constant),
    )
