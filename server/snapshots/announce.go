package snapshots

import (
	"errors"
	"strings"
)

// announcement is one message of the store's channel. Anyone who can write
// to the store can publish one, so it carries nothing a replica acts on
// without the store's word and its own: a put makes a replica read the
// record and verify it (its MAC, its cluster, its sequence); a delete is
// delivered only once the record is confirmed absent, and the replica
// drops a cluster's Workloads only when its own registry (the apiserver)
// says the cluster is gone.
type announcement struct {
	// op is "put" or "del".
	op      string
	cluster string
	// at and hash (put only) are what the store says of the record: its
	// time, and its snapshot's hash. Neither is authenticated; they only
	// spare a replica reading a record it holds already.
	at, hash string
}

// maxAnnouncementBytes bounds what is parsed of a message: a put of the
// longest cluster name, a time and a hash is far shorter.
const maxAnnouncementBytes = 512

var errAnnouncement = errors.New("malformed announcement")

// parseAnnouncement reads "put <at> <hash> <cluster>" or "del <cluster>".
// The cluster must be a registered cluster's possible name; at (at most
// 32) and hash (at most 64) are printable ASCII.
func parseAnnouncement(payload string) (announcement, error) {
	if len(payload) > maxAnnouncementBytes {
		return announcement{}, errAnnouncement
	}
	fields := strings.Split(payload, " ")
	var a announcement
	switch {
	case len(fields) == 4 && fields[0] == "put":
		a = announcement{op: "put", at: fields[1], hash: fields[2], cluster: fields[3]}
		if !isToken(a.at, 32) || !isToken(a.hash, 64) {
			return announcement{}, errAnnouncement
		}
	case len(fields) == 2 && fields[0] == "del":
		a = announcement{op: "del", cluster: fields[1]}
	default:
		return announcement{}, errAnnouncement
	}
	if checkCluster(a.cluster) != nil {
		return announcement{}, errAnnouncement
	}
	return a, nil
}

// String is the message of a.
func (a announcement) String() string {
	if a.op == "put" {
		return "put " + a.at + " " + a.hash + " " + a.cluster
	}
	return "del " + a.cluster
}

// isToken: 1 to most printable ASCII characters, no space.
func isToken(s string, most int) bool {
	if s == "" || len(s) > most {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}
