# knotless-run's transfer out: sh -c "$(this file)" knotless-get DIR
# Writes DIR's tree as a tar stream to stdout and the digest of every byte
# sent as "knotless: digest HEX" on stderr.
set -eu
dir=$1
mkdir -p /knotless
f=/knotless/xfer.$$
rm -f "$f" "$f.sum"
mkfifo "$f"
sha256sum < "$f" > "$f.sum" &
cd "$dir"
# Re-block to 64 KiB: each write becomes one frame of the exec stream,
# and tee's small writes made frames the API server relays slowly.
{ tar -cf - . || echo "knotless: tar failed" >&2; } | tee "$f" |
	{ dd bs=65536 iflag=fullblock 2>/dev/null || cat; }
wait $!
read -r sum rest < "$f.sum"
rm -f "$f" "$f.sum"
echo "knotless: digest $sum" >&2
