# knotless-run's transfer out: sh -c "$(this file)" knotless-get DIR
# Writes DIR's tree as a tar stream to stdout and the digest of every byte
# sent as "knotless: digest HEX" on stderr. The archive is staged in the
# transfer volume (node disk), then hashed while it is sent: the digest is
# of exactly the bytes sent, and no tee splits the stream into small
# frames. MD5, as in put.sh: it guards the transport, not against the pod.
set -eu
dir=$1
f=/knotless/transfer/get.$$
trap 'rm -f "$f" "$f.sum"' EXIT
# A step may have replaced the directory (a cache path) with a symbolic
# link, to / say: cd would follow it and tar the pod's whole file system.
if [ -L "$dir" ] || [ ! -d "$dir" ]; then
	echo "knotless: $dir is not a directory" >&2
	exit 3
fi
cd "$dir"
# Steps run as a non-root user: an entry a step left without owner read
# (or, for a directory, search) bits, mode 000 or 644, would stop tar.
# Its owner gives them back, entry by entry before find descends; docker's
# archive copy and the shell executor read as root and need not.
find . -mindepth 1 ! -type l \( ! -perm -400 -o -type d ! -perm -100 \) -exec chmod u+rwX {} \; 2>/dev/null || true
tar -cf "$f" .
md5sum < "$f" > "$f.sum" &
cat "$f"
wait $!
read -r sum rest < "$f.sum"
echo "knotless: digest $sum" >&2
