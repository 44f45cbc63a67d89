package protocol

import (
	"encoding/base64"
	"strings"
)

// allTokenBytes reports whether every byte of s is one of A-Z a-z 0-9 - _,
// and also = when withEquals.
func allTokenBytes(s string, withEquals bool) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
		case c == '=' && withEquals:
		default:
			return false
		}
	}
	return true
}

// jobTokenEscapePrefix marks a job token that holds an encoded job id.
const jobTokenEscapePrefix = "b64_"

// JobToken is the job id as one subject token, the last token of the job's
// event subjects: the id itself when it only has letters, digits and - _ =
// and does not start with "b64_"; otherwise "b64_" followed by the unpadded
// base64url encoding of the id (so "sched:x:1" is "b64_c2NoZWQ6eDox").
func JobToken(jobID string) string {
	if jobID != "" && allTokenBytes(jobID, true) && !strings.HasPrefix(jobID, jobTokenEscapePrefix) {
		return jobID
	}
	return jobTokenEscapePrefix + base64.RawURLEncoding.EncodeToString([]byte(jobID))
}

// JobIDOfToken is the job id a job token stands for (JobToken's inverse);
// a b64_ token that does not decode is returned as it is.
func JobIDOfToken(token string) string {
	encoded, ok := strings.CutPrefix(token, jobTokenEscapePrefix)
	if !ok {
		return token
	}
	id, err := base64.RawURLEncoding.DecodeString(encoded)
	if err != nil {
		return token
	}
	return string(id)
}
