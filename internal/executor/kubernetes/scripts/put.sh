# knotless-run's transfer in: sh -c "$(this file)" knotless-put DIR
# Unpacks the tar stream on stdin into DIR and prints the digest of every
# byte received as "knotless: digest HEX" on stderr. The stream is staged
# whole in the transfer volume (node disk) first: one pass each for
# receiving, hashing and unpacking measured faster than tee-ing the
# stream through a FIFO into sha256sum beside tar. The digest is MD5:
# it detects a transport that lost or changed bytes; against the pod it
# cannot help with any hash (the pod reports its own digest), and MD5
# costs half the CPU of SHA-256 on the node (docs/performance.md).
set -eu
dir=$1
mkdir -p "$dir"
f=/knotless/transfer/put.$$
trap 'rm -f "$f"' EXIT
cat > "$f"
sum=$(md5sum < "$f")
tar -xf "$f" -C "$dir"
echo "knotless: digest ${sum%% *}" >&2
