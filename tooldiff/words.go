package tooldiff

import "strings"

// Word is one run of the word-by-word edit of a text: Op is "=" for words
// both texts have, "-" for words only the old one has and "+" for words
// only the new one has. Text is the run's words joined by single spaces;
// no two consecutive Words have the same Op.
type Word struct {
	Op   string `json:"op"`
	Text string `json:"text"`
}

// Bounds on the edit's cost in time and memory. Past them a text is shown
// as all of the old removed and all of the new added.
const (
	maxWords = 4096    // words in either text
	maxCells = 4 << 20 // entries in the table of common subsequence lengths
)

// wordDiff returns the word-by-word edit from old to new: a longest common
// subsequence of their words, split at Unicode white space.
func wordDiff(old, new string) []Word {
	a, b := strings.Fields(old), strings.Fields(new)
	var w wordRuns
	if len(a) > maxWords || len(b) > maxWords {
		return w.whole(a, b)
	}
	// A common prefix and suffix are in every longest common subsequence,
	// so only what lies between needs the table.
	pre := 0
	for pre < len(a) && pre < len(b) && a[pre] == b[pre] {
		pre++
	}
	suf := 0
	for suf < len(a)-pre && suf < len(b)-pre && a[len(a)-1-suf] == b[len(b)-1-suf] {
		suf++
	}
	ma, mb := a[pre:len(a)-suf], b[pre:len(b)-suf]
	if (len(ma)+1)*(len(mb)+1) > maxCells {
		return w.whole(a, b)
	}
	w.add("=", a[:pre]...)
	w.lcs(ma, mb)
	w.add("=", a[len(a)-suf:]...)
	return w.done()
}

// wordRuns builds Words, merging consecutive words of one Op.
type wordRuns struct {
	words   []Word
	op      string
	pending []string
}

func (w *wordRuns) add(op string, words ...string) {
	if len(words) == 0 {
		return
	}
	if op != w.op {
		w.flush()
		w.op = op
	}
	w.pending = append(w.pending, words...)
}

func (w *wordRuns) flush() {
	if len(w.pending) > 0 {
		w.words = append(w.words, Word{Op: w.op, Text: strings.Join(w.pending, " ")})
		w.pending = w.pending[:0]
	}
}

func (w *wordRuns) done() []Word {
	w.flush()
	return w.words
}

// whole is the edit that removes all of a and adds all of b.
func (w *wordRuns) whole(a, b []string) []Word {
	w.add("-", a...)
	w.add("+", b...)
	return w.done()
}

// lcs adds the edit from a to b along a longest common subsequence,
// putting removals before additions where both would do.
func (w *wordRuns) lcs(a, b []string) {
	n, m := len(a), len(b)
	// l[i*(m+1)+j] is the length of a longest common subsequence of a[i:]
	// and b[j:]; it fits in a uint16 as neither has more than maxWords.
	l := make([]uint16, (n+1)*(m+1))
	at := func(i, j int) uint16 { return l[i*(m+1)+j] }
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				l[i*(m+1)+j] = at(i+1, j+1) + 1
			} else {
				l[i*(m+1)+j] = max(at(i+1, j), at(i, j+1))
			}
		}
	}
	i, j := 0, 0
	for i < n && j < m {
		switch {
		case a[i] == b[j]:
			w.add("=", a[i])
			i++
			j++
		case at(i+1, j) >= at(i, j+1):
			w.add("-", a[i])
			i++
		default:
			w.add("+", b[j])
			j++
		}
	}
	w.add("-", a[i:]...)
	w.add("+", b[j:]...)
}
