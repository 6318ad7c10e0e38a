package federation_test

import (
	"os"
	"testing"

	"github.com/relaymesh/relaymesh/translation/translationtest"
)

func TestMain(m *testing.M) { os.Exit(translationtest.RunMain(m)) }
