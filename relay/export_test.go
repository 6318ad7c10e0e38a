package relay

import relaypb "github.com/relaymesh/relaymesh/relay/proto"

// ValidateAssembled runs the checks a snapshot assembled from parts passes:
// ValidateSnapshot's, with s's hash taken as the hash of the bytes it came
// from (the assembler checked that).
func ValidateAssembled(cluster string, s *relaypb.Snapshot, limits SnapshotLimits) error {
	return validateSnapshot(cluster, s, limits.withDefaults(), func(*relaypb.Snapshot) string { return s.GetHash() })
}
