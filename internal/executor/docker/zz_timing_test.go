package docker

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"knotless.dev/run/internal/executor"
)

func TestZZTiming(t *testing.T) {
	d := daemon.Get(t)
	ex := newExecutor(t, d, runner(t), Config{})
	for i := 0; i < 3; i++ {
		start := time.Now()
		s, err := ex.Start(context.Background(), executor.Spec{RunID: fmt.Sprintf("seq%d", i), Runner: ex.cfg.Runner, Image: d.Image()})
		if err != nil {
			t.Fatal(err)
		}
		t1 := time.Since(start)
		_, _ = runStep(t, s, "1", "true\n")
		t2 := time.Since(start)
		s.Stop(context.Background())
		t.Logf("sequential start %s, +step %s, +stop %s", t1, t2, time.Since(start))
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			s, err := ex.Start(context.Background(), executor.Spec{RunID: fmt.Sprintf("par%d", i), Runner: ex.cfg.Runner, Image: d.Image()})
			if err != nil {
				t.Error(err)
				return
			}
			t.Logf("parallel start %s", time.Since(start))
			s.Stop(context.Background())
		}()
	}
	wg.Wait()
}
