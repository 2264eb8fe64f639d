package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	const ttl = "1y"
	cases := []struct {
		name       string
		hasNodeRef bool
		deleting   bool
		ann        map[string]string
		want       decision
	}{
		{"no node ref: requeue", false, false, nil, decision{action: actRequeueNoNode}},
		{"no node ref wins over deletion", false, true, map[string]string{annTrigger: ttl}, decision{action: actRequeueNoNode}},
		{"being deleted: stop", true, true, map[string]string{annTrigger: ttl}, decision{action: actStop}},
		{"in-progress without trigger: clear", true, false,
			map[string]string{annStatus: statusInProgress, annExpiry: "x"}, decision{action: actClearStatus}},
		{"in-progress with trigger: skip", true, false,
			map[string]string{annStatus: statusInProgress, annTrigger: ttl}, decision{action: actSkipInProgress}},
		{"in-progress with empty trigger: skip", true, false,
			map[string]string{annStatus: statusInProgress, annTrigger: ""}, decision{action: actSkipInProgress}},
		{"expiry known, no trigger: stop", true, false, map[string]string{annExpiry: "x"}, decision{action: actStop}},
		{"done, expiry known: stop", true, false,
			map[string]string{annStatus: statusDone, annExpiry: "x"}, decision{action: actStop}},
		{"nothing at all: fetch expiry", true, false, nil, decision{action: actWork, fetchExpiry: true}},
		{"failed without expiry: fetch expiry", true, false,
			map[string]string{annStatus: statusFailed}, decision{action: actWork, fetchExpiry: true}},
		{"trigger with expiry: refresh", true, false,
			map[string]string{annTrigger: ttl, annExpiry: "x"}, decision{action: actWork, refresh: true}},
		{"trigger without expiry: fetch then refresh", true, false,
			map[string]string{annTrigger: ttl}, decision{action: actWork, fetchExpiry: true, refresh: true}},
		{"trigger after done: refresh", true, false,
			map[string]string{annTrigger: ttl, annStatus: statusDone, annExpiry: "x"}, decision{action: actWork, refresh: true}},
		{"trigger after failed: refresh again", true, false,
			map[string]string{annTrigger: ttl, annStatus: statusFailed, annExpiry: "x"}, decision{action: actWork, refresh: true}},
		{"empty trigger counts as present", true, false,
			map[string]string{annTrigger: "", annExpiry: "x"}, decision{action: actWork, refresh: true}},
		{"unknown status is ignored", true, false,
			map[string]string{annStatus: "In-Progress", annTrigger: ttl, annExpiry: "x"}, decision{action: actWork, refresh: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide(tc.hasNodeRef, tc.deleting, tc.ann); got != tc.want {
				t.Fatalf("decide = %+v (%s), want %+v (%s)", got, got.action, tc.want, tc.want.action)
			}
		})
	}
}

func TestParseTTL(t *testing.T) {
	ok := map[string]int{
		"1y":    365 * 86400,
		"1Y":    365 * 86400,
		"2y":    2 * 365 * 86400,
		"6mo":   6 * 30 * 86400,
		"90d":   90 * 86400,
		"90D":   90 * 86400,
		"12h":   12 * 3600,
		"90m":   90 * 60,
		"3600s": 3600,
		"0y":    0,           // accepted and sent to the node (section 7 item 4)
		"-1d":   -86400,      // likewise
		"+1d":   86400,       // strconv.Atoi takes a sign
		"-30m":  -30 * 60,    // time.ParseDuration takes a sign too
		"1500h": 1500 * 3600, // no upper bound
	}
	for ttl, want := range ok {
		got, err := parseTTL(ttl)
		if err != nil || got != want {
			t.Errorf("parseTTL(%q) = %d, %v; want %d", ttl, got, err, want)
		}
	}
	bad := map[string]string{
		"":      "invalid TTL length",
		"y":     "invalid TTL length",
		"mo":    "invalid TTL format", // no number before "mo"
		"1w":    "invalid TTL unit: w",
		"1h30m": "invalid TTL format", // compounds: the number part "1h30" is not an integer
		"1y6mo": "invalid TTL format",
		"1.5h":  "invalid TTL format",
		"1H":    "invalid TTL unit: h", // ParseDuration is case-sensitive
		"10M":   "invalid TTL unit: m",
		"1MO":   "invalid TTL format", // "mo" is case-sensitive: unit "o", number "1M"
		"abc":   "invalid TTL format",
		" 1d":   "invalid TTL format",
		"10ms":  "invalid TTL format", // two-letter units other than "mo" never parse
	}
	for ttl, want := range bad {
		got, err := parseTTL(ttl)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseTTL(%q) = %d, %v; want an error containing %q", ttl, got, err, want)
		}
	}
}

func patchJSON(t *testing.T, before, after map[string]string) string {
	t.Helper()
	p := annotationPatch(before, after)
	if p == nil {
		return ""
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestAnnotationPatch(t *testing.T) {
	if got := patchJSON(t, map[string]string{"a": "1"}, map[string]string{"a": "1"}); got != "" {
		t.Fatalf("no change should send nothing, got %s", got)
	}
	if got := patchJSON(t, nil, map[string]string{annExpiry: "e"}); got != `{"metadata":{"annotations":{"machine.cluster.x-k8s.io/certificates-expiry":"e"}}}` {
		t.Fatalf("expiry patch: %s", got)
	}

	// A first refresh: the snapshot has only the trigger.
	before := map[string]string{annTrigger: "1y", annExpiry: "old"}
	after := copyAnnotations(before)
	after[annStatus] = statusInProgress
	if got := patchJSON(t, before, after); got != `{"metadata":{"annotations":{"v1beta2.k8sd.io/refresh-certificates-status":"in-progress"}}}` {
		t.Fatalf("in-progress patch: %s", got)
	}
	delete(after, annTrigger)
	after[annStatus] = statusDone
	after[annExpiry] = "new"
	if got := patchJSON(t, before, after); got != `{"metadata":{"annotations":{"machine.cluster.x-k8s.io/certificates-expiry":"new","v1beta2.k8sd.io/refresh-certificates":null,"v1beta2.k8sd.io/refresh-certificates-status":"done"}}}` {
		t.Fatalf("done patch: %s", got)
	}

	// A second refresh: the snapshot already says done, so the final patch does not carry the
	// status and the server keeps in-progress (design.md section 7 item 2).
	before = map[string]string{annTrigger: "1y", annStatus: statusDone, annExpiry: "old"}
	after = copyAnnotations(before)
	after[annStatus] = statusInProgress
	patchJSON(t, before, after)
	delete(after, annTrigger)
	after[annStatus] = statusDone
	after[annExpiry] = "new"
	if got := patchJSON(t, before, after); got != `{"metadata":{"annotations":{"machine.cluster.x-k8s.io/certificates-expiry":"new","v1beta2.k8sd.io/refresh-certificates":null}}}` {
		t.Fatalf("second done patch: %s", got)
	}
	// The caller's maps are not touched.
	if before[annStatus] != statusDone || before[annTrigger] != "1y" {
		t.Fatalf("snapshot changed: %v", before)
	}
}

func TestExpiryAnnotation(t *testing.T) {
	saved := time.Local
	defer func() { time.Local = saved }()
	time.Local = time.FixedZone("X", 2*3600)
	// Local time, like the provider (section 7 item 8).
	if got := expiryAnnotation(1798761600); got != "2027-01-01T02:00:00+02:00" {
		t.Fatalf("expiryAnnotation = %s", got)
	}
}
