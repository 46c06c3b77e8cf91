// Package spelling finds the name an operator probably meant: the "did
// you mean" of a config key, a server id or a tool name that is not one.
package spelling

// Closest is the candidate within two edits of word (the nearest, the
// first of equals), or "" if none is that near or word is one of them.
// Two edits catch a typo or a swapped pair of letters without offering a
// different name as the meant one.
func Closest(word string, candidates []string) string {
	best, bestD := "", 3
	for _, c := range candidates {
		d := distance(word, c)
		if d == 0 {
			return ""
		}
		if d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
