#!/usr/bin/env bash
# Checks configs/k8s/Containerfile's runtime stage without building it: every
# shared library the given binaries load must come from a Debian package the
# stage installs (or from the base image's own libc and compiler runtime).
#   runtime_libs.sh CONTAINERFILE BINARY...
# Libraries outside Debian's packages (the CUDA toolkit's, in a CUDA build)
# are listed and skipped: the CPU-only image does not link them; so are the
# sanitizers' runtimes (a --config=asan test build links them; the image's
# release build does not).
set -euo pipefail
containerfile=$1
shift
# The packages of the last `apt-get install` in the file (the runtime stage).
wanted=$(awk '/^FROM/{buf=""} {buf=buf" "$0} END{print buf}' "$containerfile" |
  sed 's/\\//g' | grep -o 'install -y --no-install-recommends[^&]*' | tail -1 |
  sed 's/install -y --no-install-recommends//')
base="libc6 libstdc++6 libgcc-s1 libgfortran5 libquadmath0 zlib1g libzstd1 liblzma5 libgomp1"
missing=0
for lib in $(ldd "$@" | awk '/=>/ && $3 ~ /^\// {print $3}' | sort -u); do
  real=$(readlink -f "$lib")
  # Debian's merged /usr: dpkg may know a library by its /lib path.
  if ! pkg=$(dpkg -S "$real" 2>/dev/null | head -1 | cut -d: -f1) &&
     ! pkg=$(dpkg -S "${real#/usr}" 2>/dev/null | head -1 | cut -d: -f1); then
    echo "not from a Debian package (skipped): $real"
    continue
  fi
  case "$pkg" in
    libasan* | libubsan* | libtsan* | liblsan*)
      echo "a sanitizer's runtime (skipped): $real"
      continue ;;
  esac
  case " $wanted $base " in
    *" $pkg "*) ;;
    *) echo "MISSING: $real comes from $pkg, which the runtime stage does not install"
       missing=1 ;;
  esac
done
[ $missing -eq 0 ] && echo "runtime stage installs:$wanted"
exit $missing
