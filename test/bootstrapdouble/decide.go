package main

// The pure parts of the double: which branch a reconcile takes given what the cache says
// about a Machine, how the provider parses a TTL, and which merge patch its patch helper
// sends. Everything here is unit-tested without an API server.

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Machine annotations shared with CK8s tooling (k8sd-protocol.md).
const (
	annTrigger = "v1beta2.k8sd.io/refresh-certificates"
	annStatus  = "v1beta2.k8sd.io/refresh-certificates-status"
	annExpiry  = "machine.cluster.x-k8s.io/certificates-expiry"

	statusInProgress = "in-progress"
	statusDone       = "done"
	statusFailed     = "failed"
)

// noNodeRequeue is how long the provider waits before looking again at a Machine without a
// node.
const noNodeRequeue = 5 * time.Second

// action is the branch a reconcile takes.
type action int

const (
	// actRequeueNoNode: no status.nodeRef yet; look again in noNodeRequeue.
	actRequeueNoNode action = iota
	// actStop: nothing to do (Machine being deleted, or expiry known and no trigger).
	actStop
	// actClearStatus: status says in-progress but there is no trigger: delete the status
	// annotation with a full Update of the cached Machine.
	actClearStatus
	// actSkipInProgress: trigger present and status in-progress: log, do nothing, no requeue.
	actSkipInProgress
	// actWork: ask the node for its expiry and/or refresh (see decision's fields).
	actWork
)

func (a action) String() string {
	switch a {
	case actRequeueNoNode:
		return "requeue-no-node"
	case actStop:
		return "stop"
	case actClearStatus:
		return "clear-status"
	case actSkipInProgress:
		return "skip-in-progress"
	case actWork:
		return "work"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// decision is what the provider's Reconcile decides before it talks to anything but its cache.
type decision struct {
	action action
	// fetchExpiry: no expiry annotation, so ask the node (certificates-expiry) first.
	fetchExpiry bool
	// refresh: a trigger is present: run the refresh flow with its TTL.
	refresh bool
}

// decide mirrors the order of checks of the provider's Reconcile: the node reference is
// checked before the deletion timestamp, the in-progress status before everything else.
func decide(hasNodeRef, deleting bool, annotations map[string]string) decision {
	if !hasNodeRef {
		return decision{action: actRequeueNoNode}
	}
	if deleting {
		return decision{action: actStop}
	}
	_, hasTrigger := annotations[annTrigger]
	_, hasExpiry := annotations[annExpiry]
	if annotations[annStatus] == statusInProgress {
		if !hasTrigger {
			return decision{action: actClearStatus}
		}
		return decision{action: actSkipInProgress}
	}
	if !hasTrigger && hasExpiry {
		return decision{action: actStop}
	}
	return decision{action: actWork, fetchExpiry: !hasExpiry, refresh: hasTrigger}
}

// Lifetimes as the provider counts them.
const (
	secondsPerDay   = 24 * 60 * 60
	secondsPerMonth = 30 * secondsPerDay
	secondsPerYear  = 365 * secondsPerDay
)

// parseTTL converts a trigger value to seconds with the provider's rules (pkg/time), quirks
// included, because they decide what the node is sent:
//   - the value is an integer followed by one unit; "mo" is months (30 d), a final "y"/"d"
//     (either case) is years (365 d) / days; any other unit goes to time.ParseDuration, so
//     "12h", "90m", "3600s" work but "1w" does not;
//   - the integer part is parsed on its own first, so compounds ("1h30m") and fractions
//     ("1.5h") are rejected even where time.ParseDuration would take them;
//   - zero and negative values are accepted and sent to the node (design.md section 7 item 4);
//   - nothing bounds the result (a huge "y" count overflows silently, as in the provider).
func parseTTL(ttl string) (int, error) {
	if len(ttl) < 2 {
		return 0, fmt.Errorf("invalid TTL length: %s", ttl)
	}
	number, unit := ttl[:len(ttl)-1], strings.ToLower(ttl[len(ttl)-1:])
	if strings.HasSuffix(ttl, "mo") {
		number, unit = ttl[:len(ttl)-2], "mo"
	}
	value, err := strconv.Atoi(number)
	if err != nil {
		return 0, fmt.Errorf("invalid TTL format: %w", err)
	}
	switch unit {
	case "y":
		return value * secondsPerYear, nil
	case "mo":
		return value * secondsPerMonth, nil
	case "d":
		return value * secondsPerDay, nil
	}
	d, err := time.ParseDuration(ttl)
	if err != nil {
		return 0, fmt.Errorf("invalid TTL unit: %s", unit)
	}
	return int(d.Seconds()), nil
}

// annotationPatch models Cluster API's patch helper as the provider uses it: the helper keeps
// the Machine as it was read (from the cache) when the reconcile began, and every Patch sends
// a JSON merge patch of the difference between that snapshot and the current object, without
// a resourceVersion. The snapshot is never advanced, so a later Patch in the same reconcile
// repeats earlier changes and omits a key whose final value equals the snapshot's (this is
// how a second refresh ends without a status annotation: design.md section 7 item 2).
//
// Only annotations change in this controller, so the patch is limited to them. It returns
// nil when there is nothing to send (the helper then makes no call).
func annotationPatch(before, after map[string]string) map[string]any {
	changes := map[string]any{}
	for k, v := range after {
		if old, ok := before[k]; !ok || old != v {
			changes[k] = v
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			changes[k] = nil // JSON null deletes the key
		}
	}
	if len(changes) == 0 {
		return nil
	}
	return map[string]any{"metadata": map[string]any{"annotations": changes}}
}

// expiryAnnotation formats a `run` answer (an absolute Unix time) like the provider:
// RFC 3339 in the process's local time zone (design.md section 7 item 8).
func expiryAnnotation(unix int) string {
	return time.Unix(int64(unix), 0).Format(time.RFC3339)
}

// copyAnnotations returns a copy that can be changed without touching the cache.
func copyAnnotations(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}
