package protocol

import (
	"encoding/base64"
	"regexp"
	"strings"
)

// plainToken is a job id that can stand as a subject token unchanged.
var plainToken = regexp.MustCompile(`^[A-Za-z0-9_=-]+$`)

// jobTokenEscapePrefix marks a job token that holds an encoded job id.
const jobTokenEscapePrefix = "b64_"

// JobToken is the job id as one subject token, the last token of the job's
// event subjects: the id itself when it only has letters, digits and - _ =
// and does not start with "b64_"; otherwise "b64_" followed by the unpadded
// base64url encoding of the id (so "sched:x:1" is "b64_c2NoZWQ6eDox").
func JobToken(jobID string) string {
	if plainToken.MatchString(jobID) && !strings.HasPrefix(jobID, jobTokenEscapePrefix) {
		return jobID
	}
	return jobTokenEscapePrefix + base64.RawURLEncoding.EncodeToString([]byte(jobID))
}
