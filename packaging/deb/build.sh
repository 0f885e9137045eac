#!/bin/sh
# build.sh: the kvstash .deb from a `make install DESTDIR=ROOT PREFIX=/usr` tree (make deb
# runs both). Adds what a package needs beyond the install: the packaged config (data_dir
# /var/lib/kvstash) as a conffile, the systemd unit, the logrotate file, maintainer scripts
# (the kvstash system user), docs, Depends from dpkg-shlibdeps; strips and compresses as
# Debian policy asks, then dpkg-deb --root-owner-group. Never touches this machine's dpkg.
#
# usage: build.sh ROOT OUT_DIR VERSION
set -eu

root=$1 out=$2 version=$3
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
arch=$(dpkg --print-architecture)
deb=$out/kvstash_${version}_${arch}.deb

# the config: the shipped one with data_dir where the package keeps its state
conf=$root/etc/kvstash/kvstashd.conf
sed 's|^data_dir \./var$|data_dir /var/lib/kvstash|' "$top/conf/kvstashd.conf" >"$conf"
grep -q '^data_dir /var/lib/kvstash$' "$conf" || { echo "build.sh: data_dir not replaced" >&2; exit 1; }
chmod 0644 "$conf"

install -D -m 0644 "$here/kvstashd.service" "$root/lib/systemd/system/kvstashd.service"
install -D -m 0644 "$here/kvstash.logrotate" "$root/etc/logrotate.d/kvstash"

doc=$root/usr/share/doc/kvstash
install -d "$doc"
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: kvstash"
    echo
    echo "Files: *"
    echo "Copyright: 2026 the kvstash authors"
    echo "License: Apache-2.0"
    echo " On Debian systems the full text of the Apache License 2.0 is in"
    echo " /usr/share/common-licenses/Apache-2.0."
} >"$doc/copyright"
{
    echo "kvstash ($version) unstable; urgency=medium"
    echo
    echo "  * Built from the kvstash tree with make deb."
    echo
    echo " -- kvstash maintainers <kvstash@example.org>  $(date -R -d @"${SOURCE_DATE_EPOCH:-$(git -C "$top" log -1 --format=%ct 2>/dev/null || date +%s)}")"
} | gzip -9n >"$doc/changelog.gz"
find "$root/usr/share/man" -type f ! -name '*.gz' -exec gzip -9nf {} +

# policy: stripped binaries, no static library or unversioned .so in a non -dev package is
# a lintian warning only (docs/operations.md lists them)
for f in "$root/usr/bin/kvstashd" "$root/usr/bin/kvstash" "$root/usr/lib/libkvstash.so.0"; do
    strip --strip-unneeded --remove-section=.comment --remove-section=.note "$f"
done
chmod 0644 "$root/usr/lib/libkvstash.so.0"

# Depends: what the binaries link, as dpkg-shlibdeps finds it (it wants a debian/control)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/debian"
printf 'Source: kvstash\n\nPackage: kvstash\nArchitecture: any\n' >"$tmp/debian/control"
shlibs=$(cd "$tmp" && dpkg-shlibdeps -O -e"$root/usr/bin/kvstashd" -e"$root/usr/bin/kvstash" \
    -e"$root/usr/lib/libkvstash.so.0" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')

install -d -m 0755 "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: kvstash
Version: $version
Architecture: $arch
Maintainer: kvstash maintainers <kvstash@example.org>
Installed-Size: $size
Depends: $shlibs, adduser, python3
Recommends: python3-msgpack
Section: database
Priority: optional
Homepage: https://github.com/kvstash/kvstash
Description: KV-cache block store for LLM inference engines
 kvstashd keeps the KV-cache blocks of inference engines in DRAM and on
 SSD and serves them over TCP, a Unix socket and TLS, with shared memory
 and RDMA for the data. This package holds the daemon (a systemd unit
 with sd_notify readiness), the kvstash command line client, the
 libkvstash C library and its header, the kvstash Python package and the
 man pages.
CONTROL
printf '/etc/kvstash/kvstashd.conf\n/etc/logrotate.d/kvstash\n' >"$root/DEBIAN/conffiles"
# libkvstash.so.0: what packages linking it depend on, and ldconfig after install
printf 'libkvstash 0 kvstash (>= %s)\n' "$version" >"$root/DEBIAN/shlibs"
printf 'activate-noawait ldconfig\n' >"$root/DEBIAN/triggers"
for s in postinst prerm postrm; do
    install -m 0755 "$here/$s" "$root/DEBIAN/$s"
done
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
    xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles" "$root/DEBIAN/md5sums" \
    "$root/DEBIAN/shlibs" "$root/DEBIAN/triggers"

mkdir -p "$out"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
