package command

import (
	"bytes"
	"io"

	"github.com/jetfleet/jetfleet/pkg/agent"
)

// maxProgressLine bounds a progress line; a longer one is plain output.
const maxProgressLine = 1024

// progressLines passes a program's output on to the job's output tail,
// except the lines that report progress: a line that starts with
// agent.ProgressLinePrefix and reads as "<fraction> <message>" is reported
// (report) instead of kept. A line with the prefix that does not read is
// kept as output, so the program's author sees it. Lines end with \n;
// stdout and stderr share the pipe, so a program writes each progress
// line in one write.
type progressLines struct {
	out    io.Writer
	report func(fraction float64, message string)
	// line holds the start of the current line while it may be a
	// progress line: a prefix of ProgressLinePrefix (matching), or a whole
	// prefix and what follows (collecting).
	line  []byte
	state lineState
}

type lineState int

const (
	lineStart  lineState = iota // at the start of a line, or inside the prefix
	collecting                  // the prefix matched: keep the line until \n
	passing                     // not a progress line: pass it on until \n
)

func (w *progressLines) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if w.state == passing {
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				_, _ = w.out.Write(p)
				return n, nil
			}
			_, _ = w.out.Write(p[:i+1])
			p = p[i+1:]
			w.state = lineStart
			continue
		}
		c := p[0]
		p = p[1:]
		w.line = append(w.line, c)
		switch {
		case w.state == lineStart && c == agent.ProgressLinePrefix[len(w.line)-1]:
			if len(w.line) == len(agent.ProgressLinePrefix) {
				w.state = collecting
			}
		case w.state == lineStart:
			w.pass(c)
		case c == '\n':
			w.endLine()
		case len(w.line) > maxProgressLine:
			w.pass(c)
		}
	}
	return n, nil
}

// pass writes the held start of the line as output and passes the rest of
// the line on (c is its last byte so far).
func (w *progressLines) pass(c byte) {
	_, _ = w.out.Write(w.line)
	w.line = w.line[:0]
	w.state = passing
	if c == '\n' {
		w.state = lineStart
	}
}

// endLine reports the collected line, or keeps it as output when it does
// not read.
func (w *progressLines) endLine() {
	text := bytes.TrimRight(w.line[len(agent.ProgressLinePrefix):], "\r\n")
	if fraction, message, err := agent.ParseProgress(string(text)); err == nil {
		w.report(fraction, message)
	} else {
		_, _ = w.out.Write(w.line)
	}
	w.line = w.line[:0]
	w.state = lineStart
}

// flush handles a last line without its \n once the output ended.
func (w *progressLines) flush() {
	switch {
	case w.state == collecting:
		w.endLine()
	case len(w.line) > 0:
		_, _ = w.out.Write(w.line)
		w.line = w.line[:0]
	}
}
