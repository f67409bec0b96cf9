package appliance_test

import (
	"bufio"
	"context"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// witnessLine is what a step writes, first thing, to its pod's
// container log (PID 1's stdout, /proc/1/fd/1): "witness ID STEP". The
// runner never reads or writes that log; the test follows it, so it
// counts starts of steps as the pods saw them, not as the runner says.
const witnessLine = `echo "witness WITNESS_ID $KNOTLESS_RUN_STEP" > /proc/1/fd/1 2>/dev/null || :`

// witness follows the container log of every run pod of the runner while
// the pod lives and counts the witness lines by "ID STEP".
type witness struct {
	k *kubeAppliance

	mu       sync.Mutex
	starts   map[string]int
	followed map[string]bool
	pods     int
	missed   int // pods gone before their log could be followed

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startWitness follows k's run pods until stop.
func startWitness(k *kubeAppliance) *witness {
	ctx, cancel := context.WithCancel(context.Background())
	w := &witness{k: k, starts: map[string]int{}, followed: map[string]bool{}, cancel: cancel}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for ctx.Err() == nil {
			pods, err := k.c.Clientset.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: k.selector()})
			if err == nil {
				for _, p := range pods.Items {
					w.follow(ctx, p)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return w
}

// follow starts following pod's log once it has started.
func (w *witness) follow(ctx context.Context, p corev1.Pod) {
	if p.Status.Phase != corev1.PodRunning && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
		return
	}
	w.mu.Lock()
	if w.followed[p.Name] {
		w.mu.Unlock()
		return
	}
	w.followed[p.Name] = true
	w.pods++
	w.mu.Unlock()
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		rc, err := w.k.c.Clientset.CoreV1().Pods(w.k.ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: "run", Follow: true}).Stream(ctx)
		if err != nil {
			w.mu.Lock()
			w.missed++
			w.mu.Unlock()
			return
		}
		defer rc.Close()
		sc := bufio.NewScanner(rc)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "witness "); ok {
				w.mu.Lock()
				w.starts[rest]++
				w.mu.Unlock()
			}
		}
	}()
}

// stop ends the following and returns the starts counted, by "ID STEP",
// the pods followed and those missed.
func (w *witness) stop() (starts map[string]int, pods, missed int) {
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.starts, w.pods, w.missed
}
