package inventory_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/flashsale/stock/internal/inventory"
)

func TestValidateUserID(t *testing.T) {
	for _, ok := range []string{"u", "u-9", "Zoë", strings.Repeat("é", inventory.MaxUserIDLength), "a b", "用户"} {
		if err := inventory.ValidateUserID(ok); err != nil {
			t.Errorf("ValidateUserID(%q) = %v, want nil", ok, err)
		}
	}
	for _, bad := range []string{
		"",
		"a\x00b",
		"a\tb",
		"a\nb",
		"\x1b[31m",
		"a\x7fb",
		"a\u0085b",              // C1 control
		"a\u2028b",              // line separator
		"a\u202eb",              // right-to-left override
		"a\xffb",                // not UTF-8
		"\xed\xa0\x80",          // an encoded surrogate is not UTF-8
		strings.Repeat("u", 65), // too long
		strings.Repeat("é", 65), // too long in characters
	} {
		err := inventory.ValidateUserID(bad)
		if !errors.Is(err, inventory.ErrInvalid) {
			t.Errorf("ValidateUserID(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}
