# knotless-run's step tool, run in the run's pod as
#   sh -c "$(this file)" knotless-step MODE STATE_DIR ID [OFFSET]
# MODE start: read "<length>\n<payload>" on stdin, start the step detached
#             in a session of its own, then stream it as follow does.
# MODE follow: stream the step's output from byte OFFSET to stdout.
# MODE kill:  kill the step and everything it started.
# Control lines go to stderr: "knotless: started", "knotless: exit CODE
# BYTES" (BYTES is the output's final length) or "knotless: unknown". After
# an exit line the runner answers "ok" on stdin once it holds every byte;
# only then is the step's output spool removed.
# The payload lives only in a shell variable and on a pipe: it is never an
# argument of any process and never written to a file.
set -u
mode=$1 root=$2 id=$3
d=$root/$id

# alive_set prints every process id now alive.
alive_set() {
  s=" "
  for p in /proc/[0-9]*; do s="$s${p#/proc/} "; done
  printf '%s\n' "$s"
}

# kill_leftovers kills every process that was not alive before the step
# started, except this shell.
kill_leftovers() {
  before=" "
  [ -r "$d/before" ] && IFS= read -r before < "$d/before"
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = "$$" ] && continue
    case "$before " in *" $pid "*) ;; *) kill -9 "$pid" 2>/dev/null ;; esac
  done
}

size() {
  n=0
  [ -e "$d/out" ] && n=$(wc -c < "$d/out")
  echo $((n))
}

nap=0.02
sleep 0.001 2>/dev/null || nap=1

# stream writes the output from $off on until the step has ended.
stream() {
  woke=
  trap 'woke=1' USR1
  echo $$ > "$d/watcher"
  wait_nap=$nap
  while :; do
    fin=
    [ -e "$d/exit" ] && fin=1
    sz=$(size)
    if [ "$sz" -gt "$off" ]; then
      tail -c +"$((off + 1))" "$d/out" | head -c "$((sz - off))" || exit 1
      off=$sz
      wait_nap=$nap
    fi
    [ -n "$fin" ] && return 0
    if [ -r "$d/pid" ]; then
      IFS= read -r spid < "$d/pid"
      if ! kill -0 "$spid" 2>/dev/null && [ ! -e "$d/exit" ]; then
        echo "knotless: unknown" >&2
        exit 0
      fi
    fi
    if [ -z "$woke" ]; then
      sleep "$wait_nap" &
      wait $! 2>/dev/null
      kill $! 2>/dev/null
      case $wait_nap in 0.02) wait_nap=0.05 ;; 0.05) wait_nap=0.1 ;; 0.1) wait_nap=0.25 ;; esac
    fi
    woke=
  done
}

# finish kills what the step left, sends the last bytes and the exit line,
# and removes the spool once the runner has everything.
finish() {
  kill_leftovers
  sz=$(size)
  if [ "$sz" -gt "$off" ]; then
    tail -c +"$((off + 1))" "$d/out" | head -c "$((sz - off))" || exit 1
    off=$sz
  fi
  IFS= read -r code < "$d/exit"
  echo "knotless: exit $code $off" >&2
  if IFS= read -r ack && [ "$ack" = ok ]; then rm -rf "$d"; fi
}

case $mode in
start)
  # The output of earlier steps goes before this step can read it.
  for old in "$root"/*; do
    [ -e "$old" ] && rm -rf "$old"
  done
  mkdir -p "$d" || exit 90
  alive_set > "$d/before"
  IFS= read -r len || exit 91
  payload=$(dd bs=1 count="$len" 2>/dev/null) || exit 92
  ss=
  command -v setsid >/dev/null 2>&1 && ss=setsid
  # The supervisor: runs the step with the payload on its stdin, then
  # writes the exit status last, atomically, and wakes the watcher.
  printf '%s\n' "$payload" | $ss sh -c '
    d=$1
    echo $$ > "$d/pid"
    sh -s > "$d/out" 2>&1
    echo $? > "$d/exit.tmp" && mv "$d/exit.tmp" "$d/exit"
    [ -r "$d/watcher" ] && IFS= read -r w < "$d/watcher" && kill -USR1 "$w" 2>/dev/null
    exit 0
  ' knotless-supervisor "$d" &
  payload=
  echo "knotless: started" >&2
  off=0
  stream
  finish
  ;;
follow)
  off=${4:-0}
  if [ ! -d "$d" ]; then
    echo "knotless: unknown" >&2
    exit 0
  fi
  stream
  finish
  ;;
kill)
  if [ -r "$d/pid" ]; then
    IFS= read -r spid < "$d/pid"
    kill -9 -- "-$spid" 2>/dev/null
  fi
  kill_leftovers
  ;;
*)
  echo "knotless: unknown mode $mode" >&2
  exit 2
  ;;
esac
