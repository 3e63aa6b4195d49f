"""Repository rule: Abseil built from source, for --config=tsan only.

ThreadSanitizer sees a lock only where the code that takes it was built with
-fsanitize=thread. Debian's gRPC takes its locks through Debian's Abseil
(gpr_mu is an absl::Mutex), so with Debian's uninstrumented Abseil every
handoff between gRPC's threads and ours would look like a race. This builds
Debian's own Abseil, the upstream tarball with the Debian revision's patches
(libabsl-dev 20220623.1-1+deb12u2: the inline namespace `debian3`, the CPU
feature checks, the CVE-2025-0838 fix, ...), and checks that every header it
then has is byte for byte the installed one: the instrumented copy linked
into a binary stands in for Debian's shared libraries, gRPC's calls
included, with the same ABI. A libabsl-dev of another revision fails here,
naming the first header that differs.

Fetched only when a target needs it (the tsan configuration); each download
is checked against its sha256. PSTRAIN_ABSL_TARBALL and
PSTRAIN_ABSL_DEBIAN_TARBALL name local copies (absolute paths) for a machine
without Debian's archive.
"""

_VERSION = "20220623.1"
_DEBIAN_REVISION = "1+deb12u2"
_POOL = "http://deb.debian.org/debian/pool/main/a/abseil/"
_ORIG = ("abseil_%s.orig.tar.gz" % _VERSION, "abfe2897f3a30edaa74bc34365afe3c2a3cd012091a97dc7e008f7016adcd5fe")
_DEBIAN = ("abseil_%s-%s.debian.tar.xz" % (_VERSION, _DEBIAN_REVISION), "e08490fc7b6f3beca1925953b0c4fb92df2de5e2a01295e4641e2a3d4e528eeb")
_SYSTEM_HEADERS = "/usr/include/absl"

def _fetch(ctx, tarball, env, output, strip_prefix = ""):
    name, sha256 = tarball
    local = ctx.os.environ.get(env, "")
    if local and not local.startswith("/"):
        fail("%s=%s: give an absolute path" % (env, local))
    result = ctx.download_and_extract(
        url = ["file://" + local] if local else [_POOL + name],
        sha256 = sha256,
        output = output,
        stripPrefix = strip_prefix,
        allow_fail = True,
    )
    if not result.success:
        fail(("could not fetch %s from %s (the tsan configuration builds Debian's Abseil from " +
              "source): put a copy on this machine and name it in %s") % (name, _POOL, env))

def _absl_source_impl(ctx):
    _fetch(ctx, _ORIG, "PSTRAIN_ABSL_TARBALL", "", "abseil-" + _VERSION)
    _fetch(ctx, _DEBIAN, "PSTRAIN_ABSL_DEBIAN_TARBALL", "debian_source")
    patches = ctx.path("debian_source/debian/patches")
    for line in ctx.read(patches.get_child("series")).splitlines():
        name = line.strip()
        if name and not name.startswith("#"):
            # GNU patch: Bazel's own refuses patches with a mail header.
            result = ctx.execute(["patch", "-p1", "--batch", "--forward", "-i", str(patches.get_child(name))])
            if result.return_code != 0:
                fail("applying Debian's %s failed (is `patch` installed? tools/setup.sh): %s%s" %
                     (name, result.stdout, result.stderr))

    # The same headers as the installed package, so the same ABI.
    system = ctx.path(_SYSTEM_HEADERS)
    if not system.exists:
        fail("%s is missing: install libabsl-dev (tools/setup.sh)" % _SYSTEM_HEADERS)
    listed = ctx.execute(["find", _SYSTEM_HEADERS, "-type", "f", "-printf", "%P\\n"])
    if listed.return_code != 0:
        fail("listing %s failed: %s" % (_SYSTEM_HEADERS, listed.stderr))
    checked = 0
    for relative in listed.stdout.splitlines():
        ours = ctx.path("absl/" + relative)
        if not ours.exists or ctx.read(ours) != ctx.read(_SYSTEM_HEADERS + "/" + relative):
            fail(("absl/%s differs from %s/%s: the installed libabsl-dev is not %s-%s, which " +
                  "third_party/absl_source.bzl builds") %
                 (relative, _SYSTEM_HEADERS, relative, _VERSION, _DEBIAN_REVISION))
        checked += 1
    if checked < 100:
        fail("%s holds only %d files: is libabsl-dev installed whole?" % (_SYSTEM_HEADERS, checked))

    # The Debian platforms package has no wasm CPUs; Abseil only uses them
    # to leave out code on WebAssembly.
    build = ctx.read("absl/BUILD.bazel")
    for cpu in ["wasm32", "wasm64"]:
        old = 'constraint_values = [\n        "@platforms//cpu:%s",\n    ],' % cpu
        if old not in build:
            fail("absl/BUILD.bazel: no %s constraint to replace" % cpu)
        build = build.replace(old, 'values = {"cpu": "%s"},' % cpu)
    ctx.file("absl/BUILD.bazel", build, legacy_utf8 = False)

absl_source = repository_rule(
    implementation = _absl_source_impl,
    environ = ["PSTRAIN_ABSL_TARBALL", "PSTRAIN_ABSL_DEBIAN_TARBALL"],
)
