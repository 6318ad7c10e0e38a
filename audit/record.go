package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"
)

// genesis is Prev of the first record.
const genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// maxLineLen bounds one line, without its "\n". Record refuses events that
// would encode longer; Verify rejects longer lines.
const maxLineLen = 64 << 10

// emptyHashSuffix ends the encoding of every Record whose Hash is "", since
// hash is its last field.
var emptyHashSuffix = []byte(`"hash":""}`)

// Record is one line on disk: the event plus its sequence number, time and
// place in the chain.
type Record struct {
	// Seq is 1 for the first record and grows by one per record.
	Seq uint64 `json:"seq"`
	// Time is when the record was written, in UTC, from the Log's clock.
	Time time.Time `json:"time"`
	Event
	// Prev is the Hash of the previous record; 64 zeros for the first.
	Prev string `json:"prev"`
	// Hash is the hex SHA-256 of Prev followed by the record's canonical
	// JSON with Hash empty (see the package documentation).
	Hash string `json:"hash"`
}

// seal returns the canonical line for r (without "\n") and its hash,
// computed from r.Prev and r's other fields; r.Hash is ignored.
func (r Record) seal() (line []byte, hash string, err error) {
	r.Hash = ""
	c, err := json.Marshal(r)
	if err != nil {
		return nil, "", err
	}
	if !bytes.HasSuffix(c, emptyHashSuffix) {
		return nil, "", errors.New("encoding does not end with the hash field")
	}
	sum := sha256.New()
	sum.Write([]byte(r.Prev))
	sum.Write(c)
	hash = hex.EncodeToString(sum.Sum(nil))

	// Put the hash between the quotes of `"hash":""}`.
	head := c[:len(c)-len(`"}`)]
	line = make([]byte, 0, len(c)+len(hash)+1) // room for Record's "\n"
	line = append(line, head...)
	line = append(line, hash...)
	line = append(line, `"}`...)
	return line, hash, nil
}
