package policy

import (
	"math"
	"testing"
)

func TestToUnits(t *testing.T) {
	if p := int64(math.Pow10(unitDigits)); p != Units {
		t.Fatalf("unitDigits %d gives %d, Units is %d", unitDigits, p, Units)
	}
	for _, tc := range []struct {
		amount float64
		want   int64
		ok     bool
	}{
		{0, 0, true},
		{1, 1000, true},
		{0.007, 7, true},
		{0.30000000000000004, 301, true}, // 0.1+0.2 in doubles: finer than a thousandth
		{12.345, 12345, true},
		{12.3451, 12346, true},
		{0.0001, 1, true},
		// A positive amount is never counted as zero.
		{1e-12, 1, true},
		{1e-300, 1, true},
		{5e-324, 1, true},
		// Rounded up at any size, not to the nearest.
		{1000000.0004, 1000000001, true},
		{4503599627.37, 4503599627370, true},
		{4503599627.3705, 4503599627371, true},
		{maxUnits/Units + 1, maxUnits + 1, true},
		{math.MaxFloat64, maxUnits + 1, true},
		{-1, 0, false},
		{-5e-324, 0, false},
		{math.NaN(), 0, false},
		{math.Inf(1), 0, false},
	} {
		got, ok := toUnits(tc.amount)
		if got != tc.want || ok != tc.ok {
			t.Errorf("toUnits(%v) = %d, %v; want %d, %v", tc.amount, got, ok, tc.want, tc.ok)
		}
	}
}
