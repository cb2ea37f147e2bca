package oci

import (
	"context"
	"strings"
	"testing"
)

// No URL an upgrade is given shows its credentials or query in an error, even one that does
// not parse (url.Parse's error quotes it whole).
func TestURLErrorsAreRedacted(t *testing.T) {
	for _, raw := range []string{
		"https://ci:hunter2@bucket.example:port/i.tar?X-Amz-Signature=s3cr3t",
		"http://ci:hunter2@bucket.example/i.tar?X-Amz-Signature=s3cr3t",
	} {
		_, err := OpenRemoteLayout(context.Background(), raw, 1<<20, false, nil)
		if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("OpenRemoteLayout(%q): %v", raw, err)
		}
		_, err = Download(context.Background(), raw, t.TempDir()+"/x", 1<<20, false, nil)
		if err == nil || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cr3t") {
			t.Errorf("Download(%q): %v", raw, err)
		}
	}
}
