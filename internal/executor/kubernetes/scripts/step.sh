# knotless-run's step tool, run in the run's pod as
#   sh -c "$(reaper.Sh)$(this file)" knotless-step MODE STATE_DIR ID [OFFSET [OUTPUTS]]
# MODE start: read "<lines>\n<payload>" on stdin (the payload is <lines>
#             whole lines), start the step in the background, then stream
#             it as follow does.
# MODE follow: stream the step's output from byte OFFSET to stdout.
# MODE kill:  kill the step and everything it started.
# MODE ledger: print STATE_DIR/ledger (nothing when there is none).
# Control lines go to stderr: "knotless: started", "knotless: exit CODE
# BYTES [outputs-empty]" (BYTES is the output's final length;
# outputs-empty: the directory OUTPUTS, looked at once the step's
# leftovers were killed, is a readable directory with no entry) or
# "knotless: unknown". After an exit line the runner answers "ok" on
# stdin once it holds every byte; only then are the step's files removed.
#
# It needs a POSIX sh and /proc, and it starts few processes: on a busy
# node each costs milliseconds. A step that prints nothing and ends at
# once costs, besides its own shell and its supervisor, one rm; a shell
# whose read has no -t (dash) naps with a sleep instead. The payload
# lives only in shell variables: it is never an argument of any process
# and never written to a file.
#
# Files of step ID, flat in STATE_DIR: ID.out (its output), ID.pid (its
# supervisor), ID.before (the processes alive before it), ID.watcher (the
# shell streaming it) and ID.exit.CODE, created when it ends: the name
# carries the code, so it exists only complete.
#
# STATE_DIR/ledger outlives them all, as long as the pod: "start ID" once
# the step's payload is read, before anything of it runs, and "exit ID
# CODE" once it ended. A runner process that took the run over after the
# one that started it died reads it, so that no step is started twice
# and a step whose output is gone still has its exit code.
#
# The pod's PID 1 holds a pipe on its fd 3 that has no name (the Job's
# command makes a FIFO, opens it and unlinks it). A step's supervisor
# writes a line to it when the step ends; the shell streaming the step
# naps in "read -t" on it and wakes at once. Where there is no such pipe,
# or read has no -t (dash), it naps with sleep and the supervisor's
# SIGUSR1 cuts the nap short.
set -u
mode=$1 root=$2 id=$3 outdir=${5:-}
d=$root/$id
before=

# alive_set sets before to every process id now alive.
alive_set() {
  before=" "
  for p in /proc/[0-9]*; do before="$before${p#/proc/} "; done
}

# kill_leftovers kills every process that was not alive before the step
# started, except this shell, with the reaper's reap_unless (passes until
# one finds nothing, which catches what was forking). The shell that
# started the step keeps that set in memory, where the step cannot change
# it; a shell that follows or kills reads it from ID.before. Processes
# that outlive every pass are left, as the exit line cannot tell them.
kill_leftovers() {
  if [ -z "$before" ]; then
    before=" "
    [ -r "$d.before" ] && IFS= read -r before < "$d.before"
  fi
  reap_unless : alive_before alive_before || :
}

# alive_before tells whether process $1 was alive before the step.
alive_before() {
  case "$before " in *" $1 "*) return 0 ;; esac
  return 1
}

# ended tells whether the step has ended, and sets code.
ended() {
  for f in "$d".exit.*; do
    [ -e "$f" ] && code=${f##*.} && return 0
  done
  return 1
}

# superseded tells whether another shell streams the step now (a runner
# process that adopted the run, or reattached, started it: ID.watcher
# names it), or its files are gone (the runner has it all). A shell
# whose exec was released is left running in the pod; it must then go
# without a word: its finish would kill the new follower, or a later
# step, as leftovers of this one.
superseded() {
  { IFS= read -r w < "$d.watcher"; } 2>/dev/null && [ "$w" = $$ ] && return 1
  return 0
}

# stream writes the output from $off on until the step has ended. The
# output is read through fd 3, whose offset is the count of bytes sent:
# cat needs no size first, and /proc tells where it stopped.
stream() {
  exec 3< "$d.out" || exit 1
  if [ "$off" -gt 0 ]; then
    dd bs=1 skip="$off" count=0 <&3 2>/dev/null || exit 1
  fi
  nap=0.02
  while :; do
    superseded && exit 0
    ended && return 0
    # A step just started has nothing to send yet, nor one that has
    # printed nothing: no cat then.
    [ -n "$quiet" ] || [ ! -s "$d.out" ] || cat <&3 || exit 1
    quiet=
    if [ -r "$d.pid" ]; then
      IFS= read -r spid < "$d.pid"
      if ! kill -0 "$spid" 2>/dev/null && ! ended; then
        echo "knotless: unknown" >&2
        exit 0
      fi
    fi
    if [ -n "$wake" ]; then
      # The supervisor's line ends the nap (the line of an earlier step
      # that ended before its shell napped ends one early: the loop
      # looks again and naps on, so at most one line waits).
      IFS= read -r -t "$nap" _w <&4 2>/dev/null
    elif [ -z "$woke" ]; then
      sleep "$nap" 2>/dev/null &
      wait $! 2>/dev/null
      case $? in
      0 | 1[2-9][0-9]) ;;
      *) nap=1 ;; # a sleep that takes no fractions
      esac
      kill $! 2>/dev/null
    fi
    case $nap in 0.02) nap=0.05 ;; 0.05) nap=0.1 ;; 0.1) nap=0.25 ;; esac
    woke=
  done
}

# outputs_empty tells whether $outdir is a directory (not a link) this
# user can list, with no entry: globs, no process. One it cannot list
# is not called empty.
outputs_empty() {
  [ -n "$outdir" ] && [ ! -L "$outdir" ] && [ -d "$outdir" ] && [ -r "$outdir" ] && [ -x "$outdir" ] || return 1
  for f in "$outdir"/* "$outdir"/.[!.]* "$outdir"/..?*; do
    if [ -e "$f" ] || [ -L "$f" ]; then return 1; fi
  done
  return 0
}

# finish kills what the step left, sends the last bytes and the exit line,
# and removes the step's files once the runner has everything.
finish() {
  superseded && exit 0
  kill_leftovers
  [ ! -s "$d.out" ] || cat <&3 || exit 1
  off=
  while read -r key value; do
    [ "$key" = pos: ] && off=$value
  done < "/proc/$$/fdinfo/3"
  empty=
  outputs_empty && empty=" outputs-empty"
  echo "knotless: exit $code $off$empty" >&2
  if IFS= read -r ack && [ "$ack" = ok ]; then rm -f "$d".*; fi
}

# watch makes the supervisor's line on the wake pipe (opened read-write
# on fd 4, so no open blocks), or where there is none its signal, cut a
# nap short at the step's end.
watch() {
  woke= wake=
  if [ -p /proc/1/fd/3 ] && [ -r /proc/1/fd/3 ] && [ -w /proc/1/fd/3 ]; then
    # dash's read has no -t: it fails with 2 where busybox and bash
    # time out or meet the end with 1 (or 0).
    IFS= read -r -t 0.001 _w < /dev/null 2>/dev/null
    case $? in 0 | 1) exec 4<> /proc/1/fd/3 && wake=1 ;; esac
  fi
  trap 'woke=1' USR1
  echo $$ > "$d.watcher"
}

case $mode in
start)
  [ -d "$root" ] || mkdir -p "$root" || exit 90
  # The output of earlier steps goes before this step can read it (the
  # runner's "ok" normally removed it already).
  old=
  for f in "$root"/*.*; do [ -e "$f" ] && old=1; done
  [ -z "$old" ] || rm -f "$root"/*.* || exit 90
  alive_set
  printf '%s\n' "$before" > "$d.before"
  IFS= read -r lines || exit 91
  payload= nl='
'
  while [ "$lines" -gt 0 ]; do
    IFS= read -r line || exit 92
    payload=$payload$line$nl
    lines=$((lines - 1))
  done
  line=
  : > "$d.out"
  echo "start $id" >> "$root/ledger" || exit 93
  watch
  # The supervisor: runs the step, then records its exit code and wakes
  # the watcher. Its own streams are not the exec's: a dropped exec
  # leaves it running.
  (
    (set +u; eval "$payload") < /dev/null >> "$d.out" 2>&1 4>&- &
    payload=
    wait $!
    code=$?
    : > "$d.exit.$code"
    echo "exit $id $code" >> "$root/ledger"
    if [ -n "$wake" ]; then
      echo >&4
    else
      [ -r "$d.watcher" ] && IFS= read -r w < "$d.watcher" && kill -USR1 "$w" 2>/dev/null
    fi
    exit 0
  ) < /dev/null > /dev/null 2>&1 &
  sup=$!
  echo "$sup" > "$d.pid"
  payload=
  echo "knotless: started" >&2
  off=0 quiet=1
  stream
  # The step has ended: its supervisor, this shell's child, exits at once.
  # Reap it before the leftovers are killed, or the kill may meet it on
  # its way out and bash reports the killed job on the control stream. A
  # wait cut short by the watcher's signal is waited again.
  while ! wait "$sup" 2>/dev/null; do kill -0 "$sup" 2>/dev/null || break; done
  finish
  ;;
follow)
  off=${4:-0} quiet=
  if [ ! -e "$d.out" ]; then
    echo "knotless: unknown" >&2
    exit 0
  fi
  watch
  stream
  finish
  ;;
ledger)
  [ ! -e "$root/ledger" ] || cat "$root/ledger"
  ;;
kill)
  if [ -r "$d.pid" ]; then
    IFS= read -r spid < "$d.pid"
    kill -9 "$spid" 2>/dev/null
  fi
  kill_leftovers
  ;;
*)
  echo "knotless: unknown mode $mode" >&2
  exit 2
  ;;
esac
