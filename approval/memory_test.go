package approval_test

import (
	"testing"

	"github.com/capsnap/capsnap/approval"
	"github.com/capsnap/capsnap/approval/approvaltest"
)

func TestMemoryKeepsTheStoreContract(t *testing.T) {
	approvaltest.Run(t, func(*testing.T) approval.Store { return approval.NewMemory(approvaltest.Retain) })
}
