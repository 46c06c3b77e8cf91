package argschema

// decimal is a JSON number read exactly, without allocating: a bound such
// as maximum 250 must refuse 250.0000000000000001, which a float64 cannot
// tell from 250.
type decimal struct {
	neg bool
	// The mantissa's digits are a followed by b (the integer and fraction
	// parts); its significant digits are positions [lo, hi) of them.
	a, b   string
	lo, hi int
	// The value is 0.(significant digits) × 10^exp.
	exp int
}

// maxExponentDigits bounds the exponents read; a number past them is left
// to the engine.
const maxExponentDigits = 9

// parseDecimal reads a number in JSON's grammar. ok is false for anything
// else and for an exponent too large to read.
func parseDecimal(s string) (d decimal, ok bool) {
	i := 0
	if i < len(s) && s[i] == '-' {
		d.neg = true
		i++
	}
	start := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	d.a = s[start:i]
	if len(d.a) == 0 || (len(d.a) > 1 && d.a[0] == '0') {
		return decimal{}, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		d.b = s[start:i]
		if len(d.b) == 0 {
			return decimal{}, false
		}
	}
	e := 0
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		negExp := false
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			negExp = s[i] == '-'
			i++
		}
		start = i
		for i < len(s) && s[i] == '0' {
			i++
		}
		digits := 0
		for i < len(s) && isDigit(s[i]) {
			e = e*10 + int(s[i]-'0')
			i++
			digits++
		}
		if i == start || digits > maxExponentDigits {
			return decimal{}, false
		}
		if negExp {
			e = -e
		}
	}
	if i != len(s) {
		return decimal{}, false
	}
	n := len(d.a) + len(d.b)
	for d.lo < n && d.at(d.lo) == '0' {
		d.lo++
	}
	d.hi = n
	for d.hi > d.lo && d.at(d.hi-1) == '0' {
		d.hi--
	}
	if d.lo == d.hi {
		return decimal{}, true // zero, whatever its sign
	}
	d.exp = len(d.a) + e - d.lo
	return d, true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func (d *decimal) at(i int) byte {
	if i < len(d.a) {
		return d.a[i]
	}
	return d.b[i-len(d.a)]
}

func (d *decimal) zero() bool { return d.lo == d.hi }

// integer reports whether d is a whole number (JSON Schema's "integer").
func (d *decimal) integer() bool { return d.zero() || d.exp >= d.hi-d.lo }

// cmp compares x and y: -1, 0 or +1.
func (x *decimal) cmp(y *decimal) int {
	switch {
	case x.zero() && y.zero():
		return 0
	case x.zero():
		return y.sign() * -1
	case y.zero():
		return x.sign()
	case x.neg != y.neg:
		return x.sign()
	}
	return x.sign() * x.cmpMagnitude(y)
}

func (d *decimal) sign() int {
	if d.neg {
		return -1
	}
	return 1
}

func (x *decimal) cmpMagnitude(y *decimal) int {
	if x.exp != y.exp {
		if x.exp < y.exp {
			return -1
		}
		return 1
	}
	nx, ny := x.hi-x.lo, y.hi-y.lo
	for i := 0; i < nx && i < ny; i++ {
		if cx, cy := x.at(x.lo+i), y.at(y.lo+i); cx != cy {
			if cx < cy {
				return -1
			}
			return 1
		}
	}
	switch {
	case nx < ny:
		return -1
	case nx > ny:
		return 1
	}
	return 0
}
