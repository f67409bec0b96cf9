package kubernetes

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"knotless.dev/run/internal/executor"
)

// TestBuildDisruptionBudget: a run's budget wants its pod available
// (minAvailable 1, not maxUnavailable 0, which the disruption controller
// cannot count for a Job's pods), selects the Job's pods and no other pod (another
// run's, another runner's, a warm one), is labelled with the runner and
// the run, and is owned by the Job. A warm Job a run took gets the
// run's label though its name and its pods' labels are the warm pod's.
func TestBuildDisruptionBudget(t *testing.T) {
	t.Parallel()
	spec := executor.Spec{RunID: "r1", Runner: "did:plc:runner", Trusted: true}
	job, err := BuildJob("runs", spec, PodOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	job.UID = types.UID("uid-1")
	pdb := BuildDisruptionBudget(job, "r1")
	golden(t, "budget.golden.yaml", pdb)

	if got := pdb.Spec.MinAvailable; got == nil || got.String() != "1" || pdb.Spec.MaxUnavailable != nil {
		t.Errorf("minAvailable %v, maxUnavailable %v; want 1 and none", got, pdb.Spec.MaxUnavailable)
	}
	if pdb.Labels[LabelRunner] != RunnerLabel(spec.Runner) || pdb.Labels[LabelRun] != "r1" {
		t.Errorf("labels %v, want the runner's and the run's", pdb.Labels)
	}
	if or := pdb.OwnerReferences; len(or) != 1 || or[0].Kind != "Job" || or[0].Name != job.Name || or[0].UID != job.UID {
		t.Errorf("owner references %+v, want the Job", or)
	}
	sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	// A pod's labels as the Job controller gives them: the template's
	// and the Job's name.
	podOf := func(job *batchv1.Job) labels.Set {
		l := labels.Set{labelJobName: job.Name}
		for k, v := range job.Spec.Template.Labels {
			l[k] = v
		}
		return l
	}
	other, _ := BuildJob("runs", executor.Spec{RunID: "r2", Runner: spec.Runner}, PodOptions{Image: "busybox"})
	otherRunner, _ := BuildJob("runs", executor.Spec{RunID: "r1", Runner: "did:plc:other"}, PodOptions{Image: "busybox"})
	for _, tt := range []struct {
		name string
		pod  labels.Set
		want bool
	}{
		{"the run's pod", podOf(job), true},
		{"another run's pod", podOf(other), false},
		{"another runner's pod of the same run name", podOf(otherRunner), false},
	} {
		if got := sel.Matches(tt.pod); got != tt.want {
			t.Errorf("%s: selected %v, want %v", tt.name, got, tt.want)
		}
	}

	warm := job.DeepCopy()
	warm.Name = warmPrefix + "abc"
	delete(warm.Spec.Template.Labels, LabelRun)
	warm.Spec.Template.Labels[LabelWarm] = "true"
	warm.Labels = map[string]string{LabelRunner: RunnerLabel(spec.Runner), LabelRun: "r3"} // as taken
	wp := BuildDisruptionBudget(warm, "r3")
	wsel, _ := metav1.LabelSelectorAsSelector(wp.Spec.Selector)
	if wp.Name != warm.Name || wp.Labels[LabelRun] != "r3" || !wsel.Matches(podOf(warm)) || wsel.Matches(podOf(job)) {
		t.Errorf("budget of a taken warm Job: %s %v selecting %s; want the Job's name, the run's label, its pods only", wp.Name, wp.Labels, wsel)
	}
}

// TestPodAnnotationsSafeToEvict: a run pod tells the cluster autoscaler
// to keep its node; the Job itself carries no such annotation.
func TestPodAnnotationsSafeToEvict(t *testing.T) {
	t.Parallel()
	job, err := BuildJob("runs", executor.Spec{RunID: "r1", Runner: "did:plc:runner", Annotations: map[string]string{"dev.knotless.check": "x"}}, PodOptions{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	if got := job.Spec.Template.Annotations[AnnotationSafeToEvict]; got != "false" {
		t.Errorf("pod annotation %s = %q, want \"false\"", AnnotationSafeToEvict, got)
	}
	if _, ok := job.Annotations[AnnotationSafeToEvict]; ok {
		t.Errorf("the Job carries %s: it is the pod's", AnnotationSafeToEvict)
	}
	if job.Spec.Template.Annotations["dev.knotless.check"] != "x" || job.Spec.Template.Annotations[AnnotationDID] != "did:plc:runner" {
		t.Errorf("pod annotations %v lack the run's", job.Spec.Template.Annotations)
	}
}
