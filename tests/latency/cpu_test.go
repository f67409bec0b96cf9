package latency

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// cpuTimes is the processor time, in clock ticks, of every process on
// the machine by its command name: its threads' (utime, stime) and its
// waited-for children's (cutime, cstime; git for the daemon), from
// /proc/PID/stat. Processes that end between two readings are in their
// parent's children.
func cpuTimes() map[string]int64 {
	by := map[string]int64{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, name := range stats {
		data, err := os.ReadFile(name)
		if err != nil {
			continue // ended meanwhile
		}
		s := string(data)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || end+2 > len(s) {
			continue
		}
		comm := s[open+1 : end]
		f := strings.Fields(s[end+2:]) // from field 3, state
		if len(f) < 15 {
			continue
		}
		for i, who := range []string{comm, comm, comm + " (children)", comm + " (children)"} {
			n, _ := strconv.ParseInt(f[11+i], 10, 64) // utime, stime, cutime, cstime
			by[who] += n
		}
	}
	return by
}

// cpuBetween says, in milliseconds, the processor time each command
// used from before to after, most first, those under 10 ms left out.
// USER_HZ is 100 on Linux: a tick is 10 ms.
func cpuBetween(before, after map[string]int64) string {
	type use struct {
		who string
		ms  int64
	}
	var uses []use
	var total int64
	for who, t := range after {
		if d := (t - before[who]) * 10; d > 0 {
			uses = append(uses, use{who, d})
			total += d
		}
	}
	slices.SortFunc(uses, func(a, b use) int { return cmp.Or(cmp.Compare(b.ms, a.ms), strings.Compare(a.who, b.who)) })
	var b strings.Builder
	fmt.Fprintf(&b, "%d ms in all", total)
	for _, u := range uses {
		if u.ms >= 10 {
			fmt.Fprintf(&b, "; %s %d", u.who, u.ms)
		}
	}
	return b.String()
}
