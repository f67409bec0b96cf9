// Package reaper is the one way the container executors (docker and
// kubernetes) kill what a step left running: a POSIX sh function that
// scans /proc in the container's PID namespace and kills every process
// the caller does not keep, pass after pass until a pass finds nothing.
// The scripts that run in a container (Docker's launcher and reaper,
// the Kubernetes step tool) start with Sh; each says, in a function of
// its own, which processes it keeps: Docker those of a live exec's
// session, Kubernetes those alive before the step started (its steps
// outlive their exec, so a session cannot tell their processes there).
//
// The shell executor runs steps on the runner's own host, where a scan
// of every process is not the step's to make: it kills the step's
// session from Go (internal/executor/shell).
package reaper

// Sh defines, in any POSIX sh with /proc and no other program:
//
//	proc_stat PID
//	  sets st (the state letter), pp (the parent) and sid (the session)
//	  of PID from /proc/PID/stat, or fails when PID is gone.
//	reap_unless PREPARE KEEP [KEEP_PID]
//	  kills with SIGKILL every process of the PID namespace but the
//	  calling shell, zombies, and each PID for which "KEEP PID" succeeds
//	  (proc_stat has set st, pp and sid for it). KEEP_PID, when given, is
//	  asked first with the PID alone: a process it keeps costs no read of
//	  its stat file, which sh's read takes a byte at a time (a few
//	  hundred system calls). PREPARE runs before each pass (":" for
//	  nothing). A pass stops each process it finds
//	  (SIGSTOP) and kills them all at its end, so that none runs again
//	  in between: a shell never reports its child's death ("Killed") into
//	  the step's output. It repeats until a pass finds nothing, and fails
//	  when 100 passes each still found something to kill.
//
// Its own variables start with reap_; proc_stat also sets reap_l.
const Sh = `proc_stat() { { read -r reap_l <"/proc/$1/stat"; } 2>/dev/null || return 1; reap_l=${reap_l##*") "}; set -f; set -- $reap_l; set +f; st=$1 pp=$2 sid=$4; }
reap_unless() {
	reap_n=0
	while :; do
		"$1"
		reap_hit=
		for reap_d in /proc/[0-9]*; do
			reap_p=${reap_d#/proc/}
			[ "$reap_p" = "$$" ] && continue
			[ -n "${3:-}" ] && "$3" "$reap_p" && continue
			proc_stat "$reap_p" || continue
			case $st in Z|X|x) continue;; esac
			"$2" "$reap_p" && continue
			kill -STOP "$reap_p" 2>/dev/null && reap_hit="$reap_hit $reap_p"
		done
		[ -z "$reap_hit" ] && return 0
		kill -9 $reap_hit 2>/dev/null
		reap_n=$((reap_n+1))
		[ "$reap_n" -lt 100 ] || return 1
	done
}
`
