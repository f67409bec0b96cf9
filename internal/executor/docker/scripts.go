package docker

// The two fixed sh scripts the executor runs in a container, as the
// argv of an exec. Neither carries a value of the run: a step's payload
// only ever travels on the exec's stdin.

// launcher starts a step. The runtime starts every exec in a session of
// its own; the launcher prints that session's id as the first line of
// its stdout, then becomes `sh -s` and reads the payload from stdin.
const launcher = `s=$$
if { read -r l </proc/$$/stat; } 2>/dev/null; then set -f; l=${l##*") "}; set -- $l; s=$4; fi
echo "` + sidMarker + ` $s"
exec sh -s`

// sidMarker starts the launcher's first line.
const sidMarker = "knotless-step"

// reaper kills processes by session, as seen from inside the container.
// Its argument is a step's session id, or "all".
//
// A session is live when one of its processes has parent 0: that is an
// exec's own process (the keep-alive's init, a running step, this
// reaper), whose parent is outside the container's PID namespace. A
// process that called setsid, or whose step ended, belongs to no live
// session. With a session id, the reaper kills that session and every
// process of no live session; with "all", everything but the init's
// session. It repeats until a pass finds nothing to kill, and prints
// "reaped" when it is done.
const reaper = `S=$1 me=$$ n=0
stat() { { read -r l <"/proc/$1/stat"; } 2>/dev/null || return 1; l=${l##*") "}; set -f; set -- $l; set +f; st=$1 pp=$2 sid=$4; }
while :; do
	live=" $me "
	for d in /proc/[0-9]*; do
		p=${d#/proc/}
		stat "$p" || continue
		if [ "$S" = all ]; then
			if [ "$p" = 1 ]; then live="$live$sid "; fi
		elif [ "$pp" = 0 ] && [ "$sid" != "$S" ]; then
			live="$live$sid "
		fi
	done
	hit=
	for d in /proc/[0-9]*; do
		p=${d#/proc/}
		[ "$p" = "$me" ] && continue
		stat "$p" || continue
		case $st in Z|X|x) continue;; esac
		case $live in *" $sid "*) continue;; esac
		kill -9 "$p" 2>/dev/null && hit=1
	done
	if [ -z "$hit" ]; then echo reaped; exit 0; fi
	n=$((n+1))
	if [ "$n" -ge 100 ]; then echo "processes survive SIGKILL"; exit 1; fi
done`
