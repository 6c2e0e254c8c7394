# Sourced on the GPU machine after /work/shared/device/fetch-deps.sh filled .devdeps/ here:
#   source scripts/device-env.sh && cmake -S . -B /tmp/b ... 
# The carried Debian packages are unpacked under /opt/devdeps by .devdeps/env.sh; their
# pkg-config files still say prefix=/usr, so point them at the unpacked tree.
# A warm machine keeps /opt/devdeps from an earlier call, and .devdeps/env.sh unpacks only into
# an empty one: when the carried .debs are not the ones unpacked there (a package added to
# fetch-deps.sh's list since), unpack again.
debs_stamp=$(ls .devdeps/debs | md5sum | cut -d' ' -f1)
if [ -d /opt/devdeps/usr ] && [ "$(cat /opt/devdeps/.debs 2>/dev/null)" != "$debs_stamp" ]; then
  rm -rf /opt/devdeps
fi
source .devdeps/env.sh
echo "$debs_stamp" > /opt/devdeps/.debs
for pc in /opt/devdeps/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc /opt/devdeps/usr/share/pkgconfig/*.pc; do
  [ -f "$pc" ] && sed -i 's#^prefix=/usr$#prefix=/opt/devdeps/usr#' "$pc"
done
export PKG_CONFIG_PATH=/opt/devdeps/usr/lib/x86_64-linux-gnu/pkgconfig:/opt/devdeps/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
# Extra packages xserv needs beyond fetch-deps.sh's defaults (pass them to fetch-deps.sh):
#   libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2
# and, for the compiler cache that scripts/device_round.sh shares between requests, ccache libhiredis0.14.
