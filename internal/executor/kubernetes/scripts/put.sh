# knotless-run's transfer in: sh -c "$(this file)" knotless-put DIR MARK
# Unpacks the tar stream on stdin into DIR, straight from the exec's
# stdin. The runner ends the stream with an entry named MARK (drawn for
# this transfer) and no end-of-archive blocks, so tar stops at the
# stream's end; MARK exists only when tar got every entry before it. The
# script then removes it and prints "knotless: end MARK" on stderr. A
# stream cut short (an exec's stdin can be closed early and the exec
# still report success) leaves no MARK, and the runner sends it again.
# This shell stays tar's parent and keeps the exec's streams open: the
# runtime closes an exec's stdin when its process closes its output.
set -eu
dir=$1 mark=$2
mkdir -p "$dir"
tar -xf - -C "$dir"
if [ -e "$dir/$mark" ]; then
	rm -f "$dir/$mark"
	echo "knotless: end $mark" >&2
fi
