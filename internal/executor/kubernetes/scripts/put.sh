# knotless-run's transfer in: sh -c "$(this file)" knotless-put DIR
# Unpacks the tar stream on stdin into DIR and prints the digest of every
# byte received as "knotless: digest HEX" on stderr. The stream goes
# straight into tar -x while tee copies it through a FIFO into md5sum:
# no staged copy on disk, and unpacking (which for many small files is
# most of the time) overlaps the transfer (docs/performance.md). After
# tar has read the end of the archive, the rest of the stream is read
# too, so the digest always covers every byte the runner sent. The
# digest is MD5: it detects a transport that lost or changed bytes;
# against the pod it cannot help with any hash (the pod reports its own
# digest), and MD5 costs half the CPU of SHA-256 on the node.
set -eu
dir=$1
mkdir -p "$dir"
p=/knotless/transfer/put.$$
trap 'rm -f "$p" "$p.sum"' EXIT
mkfifo "$p"
md5sum < "$p" > "$p.sum" &
tee "$p" | { tar -xf - -C "$dir"; wc -c > /dev/null; }
wait $!
read -r sum rest < "$p.sum"
echo "knotless: digest $sum" >&2
