package platform

import (
	"strings"
)

// Some metadata YAML holds values machined's YAML subset refuses (Hetzner's vendor_data is a
// long quoted string folded over lines), yet only a few plain top-level keys are needed. These
// read just those, line by line, and skip whatever else is there.

// topLevelKeys returns the plain scalar values of the wanted top-level keys ("key: value" at
// column 0). A value that is not a one-line scalar (a block, a list, a flow collection, an
// unterminated quote) reads as absent; the first occurrence of a key wins.
func topLevelKeys(data []byte, wanted ...string) map[string]string {
	out := map[string]string{}
	want := map[string]bool{}
	for _, k := range wanted {
		want[k] = true
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimRight(line, "\r")
		if line == "" || line[0] == ' ' || line[0] == '\t' || line[0] == '#' || line[0] == '-' {
			continue
		}
		i := strings.Index(line, ":")
		if i <= 0 {
			continue
		}
		key := unquote(strings.TrimSpace(line[:i]))
		rest := line[i+1:]
		if !want[key] || (rest != "" && rest[0] != ' ' && rest[0] != '\t') {
			continue
		}
		if _, seen := out[key]; seen {
			continue
		}
		if v, ok := plainValue(strings.TrimSpace(rest)); ok {
			out[key] = v
		}
	}
	return out
}

// plainValue reads a one-line scalar: plain up to a comment, or quoted (single quotes with
// doubled quotes inside, double quotes with no escape other than a quote).
func plainValue(v string) (string, bool) {
	if v == "" {
		return "", false
	}
	switch v[0] {
	case '"', '\'':
		q := v[0]
		end := strings.LastIndexByte(v, q)
		if end == 0 {
			return "", false
		}
		if tail := strings.TrimSpace(v[end+1:]); tail != "" && !strings.HasPrefix(tail, "#") {
			return "", false
		}
		s := v[1:end]
		if q == '\'' {
			return strings.ReplaceAll(s, "''", "'"), true
		}
		if strings.Contains(strings.ReplaceAll(s, `\"`, ""), `\`) {
			return "", false // other escapes: not worth guessing at
		}
		return strings.ReplaceAll(s, `\"`, `"`), true
	case '|', '>', '[', '{', '&', '*', '!':
		return "", false
	}
	if i := strings.Index(v, " #"); i >= 0 {
		v = strings.TrimSpace(v[:i])
	}
	return v, v != "" && v != "~" && v != "null"
}

func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' || s[0] == '\'') && s[len(s)-1] == s[0] {
		return s[1 : len(s)-1]
	}
	return s
}

// topLevelBlock returns the lines that make up the value of a top-level "key:" (indented
// lines, or a list at column 0), or nil when the key is absent or holds a one-line value.
func topLevelBlock(data []byte, key string) []byte {
	lines := strings.Split(string(data), "\n")
	for i, line := range lines {
		line = strings.TrimRight(line, "\r \t")
		if line != key+":" && line != `"`+key+`":` && !strings.HasPrefix(line, key+": #") {
			continue
		}
		var block []string
		for _, l := range lines[i+1:] {
			l = strings.TrimRight(l, "\r")
			t := strings.TrimSpace(l)
			if t == "" || strings.HasPrefix(t, "#") || l[0] == ' ' || l == "-" || strings.HasPrefix(l, "- ") {
				block = append(block, l)
				continue
			}
			break
		}
		if len(block) == 0 {
			return nil
		}
		return []byte(strings.Join(block, "\n") + "\n")
	}
	return nil
}
