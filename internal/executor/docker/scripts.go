package docker

import "knotless.dev/run/internal/executor/reaper"

// The two fixed sh scripts the executor runs in a container, as the
// argv of an exec. Neither carries a value of the run: a step's payload
// only ever travels on the exec's stdin.

// reapFuncs kill processes by session, as seen from inside the
// container, with reaper.Sh.
//
// A session is live when one of its processes has parent 0: that is an
// exec's own process (the keep-alive's init, a running step's launcher,
// a reaper), whose parent is outside the container's PID namespace. A
// process that called setsid, or whose step ended, belongs to no live
// session. reap S kills session S and every process of no live session;
// reap all kills everything but the init's session. Neither kills the
// calling shell. The live sessions are found again before each pass.
const reapFuncs = reaper.Sh + `live_sessions() {
	live=" "
	for d in /proc/[0-9]*; do
		p=${d#/proc/}
		proc_stat "$p" || continue
		if [ "$target" = all ]; then
			if [ "$p" = 1 ]; then live="$live$sid "; fi
		elif [ "$pp" = 0 ] && [ "$sid" != "$target" ]; then
			live="$live$sid "
		fi
	done
}
in_live_session() { case $live in *" $sid "*) return 0;; esac; return 1; }
reap() { target=$1; reap_unless live_sessions in_live_session; }
`

// launcher runs a step. The runtime starts every exec in a session of
// its own; the launcher prints that session's id as the first line of
// its stdout, runs `sh -s`, which reads the payload from stdin, and when
// that shell has ended kills everything the step left, then exits with
// the shell's status. So a step's exec ends only when nothing of the
// step is left, and nothing holds its output open. Its stderr goes to
// its stdout: one pipe keeps the order in which the step wrote, which
// the daemon's two streams would not.
const launcher = reapFuncs + `exec 2>&1
s=$$
proc_stat $$ && s=$sid
echo "` + sidMarker + ` $s"
sh -s
rc=$?
reap "$s" || echo "knotless-run: processes of the step survive SIGKILL"
exit "$rc"`

// sidMarker starts the launcher's first line.
const sidMarker = "knotless-step"

// reapScript kills from a second exec: its argument is a step's session id
// (KillStep), or "all" (Stop of a kept session). It prints "reaped" when
// it is done.
const reapScript = reapFuncs + `reap "$1" && echo reaped`
