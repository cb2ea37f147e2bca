// Package yaml parses the YAML subset machined reads (machined uses Go's standard library only).
// It covers what machine configs and service files need (docs/machine-config.md lists it): block
// mappings and sequences, plain/single/double-quoted scalars, one-line flow collections ([a, b],
// {k: v}), literal and folded block scalars (| |- > >-, for PEM certificates), comments, a leading
// "---". Anchors, aliases, tags, multi-line flow collections and multi-document streams are
// refused with the line number rather than misread.
//
// The result is the same tree encoding/json produces (map[string]interface{}, []interface{},
// string, float64/json.Number, bool, nil), so YAML and JSON configs share one strict decoding path.
package yaml

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

type yamlLine struct {
	num    int // 1-based, for errors
	indent int
	text   string // without the indentation
}

type yamlParser struct {
	name  string
	lines []yamlLine
	pos   int
	depth int // nesting of block collections, bounded by MaxDepth
}

// Limits on hostile input: a config is a few kilobytes, so these only stop a config drive
// or a config server from making PID 1 run out of stack or memory.
const (
	MaxSize  = 1 << 20 // bytes in one document
	MaxDepth = 64      // nested collections (block and flow together)
)

// Error is a parse error: the document's name and, when known, the line.
type Error struct {
	name string
	line int
	msg  string
}

func (e *Error) Error() string {
	if e.line == 0 { // about the whole document
		return fmt.Sprintf("%s: %s", e.name, e.msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.name, e.line, e.msg)
}

// Parse parses one document of the subset; name is used in error messages.
func Parse(name string, data []byte) (interface{}, error) {
	if len(data) > MaxSize {
		return nil, &Error{name, 0, fmt.Sprintf("%d bytes is more than the %d a document may have", len(data), MaxSize)}
	}
	p := &yamlParser{name: name}
	for i, raw := range strings.Split(strings.ReplaceAll(string(data), "\r\n", "\n"), "\n") {
		text := strings.TrimLeft(raw, " ")
		if strings.HasPrefix(text, "\t") && strings.TrimSpace(text) != "" {
			return nil, &Error{name, i + 1, "tabs are not allowed in indentation"}
		}
		p.lines = append(p.lines, yamlLine{num: i + 1, indent: len(raw) - len(text), text: strings.TrimRight(text, " \t")})
	}
	if l := p.next(); l != nil && l.indent == 0 && (l.text == "---" || strings.HasPrefix(l.text, "--- ")) {
		if rest := strings.TrimSpace(l.text[3:]); rest != "" && !strings.HasPrefix(rest, "#") {
			return nil, p.errAt(l, "content after --- is not supported")
		}
		p.pos++
	}
	value, err := p.block(0)
	if err != nil {
		return nil, err
	}
	if l := p.next(); l != nil {
		if l.text == "..." {
			p.pos++
			if l2 := p.next(); l2 == nil {
				return value, nil
			}
		}
		if l.text == "---" {
			return nil, p.errAt(l, "multiple documents are not supported")
		}
		return nil, p.errAt(l, "unexpected indentation or content")
	}
	return value, nil
}

// lineNum is the number of the line being read, for errors not tied to a yamlLine.
func (p *yamlParser) lineNum() int {
	if p.pos < len(p.lines) {
		return p.lines[p.pos].num
	}
	return len(p.lines)
}

func (p *yamlParser) errAt(l *yamlLine, format string, args ...interface{}) error {
	return &Error{p.name, l.num, fmt.Sprintf(format, args...)}
}

// next returns the next line that is not blank or a comment, without consuming it.
func (p *yamlParser) next() *yamlLine {
	for p.pos < len(p.lines) {
		l := &p.lines[p.pos]
		if l.text != "" && !strings.HasPrefix(l.text, "#") {
			return l
		}
		p.pos++
	}
	return nil
}

func isSeqItem(text string) bool { return text == "-" || strings.HasPrefix(text, "- ") }

// block parses the node starting at the next line if it is indented at least minIndent.
func (p *yamlParser) block(minIndent int) (interface{}, error) {
	l := p.next()
	if l == nil || l.indent < minIndent {
		return nil, nil
	}
	if p.depth++; p.depth > MaxDepth {
		return nil, p.errAt(l, "nested more than %d levels deep", MaxDepth)
	}
	defer func() { p.depth-- }()
	if isSeqItem(l.text) {
		return p.sequence(l.indent)
	}
	if _, _, ok := splitKey(l.text); !ok {
		// a lone scalar document (or a scalar on its own line under "key:")
		p.pos++
		return p.inline(l.text, l, l.indent-1)
	}
	return p.mapping(l.indent)
}

func (p *yamlParser) sequence(indent int) (interface{}, error) {
	if p.depth++; p.depth > MaxDepth {
		return nil, &Error{p.name, p.lineNum(), fmt.Sprintf("nested more than %d levels deep", MaxDepth)}
	}
	defer func() { p.depth-- }()
	items := []interface{}{}
	for {
		l := p.next()
		if l == nil || l.indent < indent {
			return items, nil
		}
		if l.indent == indent && !isSeqItem(l.text) {
			return items, nil // the next key of a mapping whose items sat at its key's column
		}
		if l.indent > indent {
			return nil, p.errAt(l, "expected a '- ' item at column %d", indent+1)
		}
		rest := strings.TrimLeft(l.text[1:], " ")
		col := indent + len(l.text) - len(rest)
		var item interface{}
		var err error
		switch {
		case rest == "" || strings.HasPrefix(rest, "#"):
			p.pos++
			item, err = p.block(indent + 1)
		case isSeqItem(rest):
			*l = yamlLine{num: l.num, indent: col, text: rest} // "- - x": a nested sequence
			item, err = p.sequence(col)
		default:
			if _, _, ok := splitKey(rest); ok && !strings.HasPrefix(rest, "{") && !strings.HasPrefix(rest, "[") {
				*l = yamlLine{num: l.num, indent: col, text: rest} // "- k: v": a mapping at the item's column
				item, err = p.mapping(col)
			} else {
				p.pos++
				item, err = p.inline(rest, l, indent)
			}
		}
		if err != nil {
			return nil, err
		}
		items = append(items, item)
	}
}

func (p *yamlParser) mapping(indent int) (interface{}, error) {
	if p.depth++; p.depth > MaxDepth {
		return nil, &Error{p.name, p.lineNum(), fmt.Sprintf("nested more than %d levels deep", MaxDepth)}
	}
	defer func() { p.depth-- }()
	m := map[string]interface{}{}
	for {
		l := p.next()
		if l == nil || l.indent < indent {
			return m, nil
		}
		if l.indent > indent {
			return nil, p.errAt(l, "unexpected indentation")
		}
		if isSeqItem(l.text) || (indent == 0 && (l.text == "---" || l.text == "...")) {
			return m, nil // a sequence at a parent mapping's key column, or the document's end
		}
		key, rest, ok := splitKey(l.text)
		if !ok {
			return nil, p.errAt(l, "expected 'key: value'")
		}
		k, err := p.key(key, l)
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			return nil, p.errAt(l, "duplicate key %q", k)
		}
		p.pos++
		var value interface{}
		if rest == "" || strings.HasPrefix(rest, "#") {
			n := p.next()
			switch {
			case n != nil && n.indent > indent:
				value, err = p.block(indent + 1)
			case n != nil && n.indent == indent && isSeqItem(n.text):
				value, err = p.sequence(indent) // "key:\n- a": YAML allows the items at the key's column
			}
		} else {
			value, err = p.inline(rest, l, indent)
		}
		if err != nil {
			return nil, err
		}
		m[k] = value
	}
}

func (p *yamlParser) key(text string, l *yamlLine) (string, error) {
	if strings.HasPrefix(text, "\"") || strings.HasPrefix(text, "'") {
		s, rest, err := quoted(text)
		if err != nil || strings.TrimSpace(rest) != "" {
			return "", p.errAt(l, "bad quoted key %s", text)
		}
		return s, nil
	}
	if text == "" {
		return "", p.errAt(l, "empty key")
	}
	if strings.ContainsAny(text[:1], "&*!?|>[]{},%@`") {
		return "", p.errAt(l, "unsupported key %q (anchors, tags and complex keys are not in the subset)", text)
	}
	return text, nil
}

// splitKey splits "key: rest" at the first ": " (or a final ':') outside quotes.
func splitKey(text string) (string, string, bool) {
	if strings.HasPrefix(text, "\"") || strings.HasPrefix(text, "'") {
		_, after, err := quoted(text)
		if err != nil {
			return "", "", false
		}
		i := len(text) - len(after)
		if strings.HasPrefix(after, ":") && (len(after) == 1 || after[1] == ' ') {
			return text[:i], strings.TrimSpace(after[1:]), true
		}
		return "", "", false
	}
	for i := 0; i < len(text); i++ {
		if text[i] == '#' && i > 0 && text[i-1] == ' ' {
			return "", "", false
		}
		if text[i] == ':' && (i+1 == len(text) || text[i+1] == ' ') && i > 0 {
			return strings.TrimSpace(text[:i]), strings.TrimSpace(text[i+1:]), true
		}
	}
	return "", "", false
}

// inline parses a value written after "key:" or "- "; parentIndent bounds block scalars.
func (p *yamlParser) inline(text string, l *yamlLine, parentIndent int) (interface{}, error) {
	if text == "" {
		return nil, nil
	}
	switch text[0] {
	case '|', '>':
		return p.blockScalar(text, l, parentIndent)
	case '[', '{':
		f := &flowParser{text: text, depth: p.depth}
		v, err := f.value()
		if err == nil {
			f.space()
			if f.i < len(f.text) && f.text[f.i] != '#' {
				err = fmt.Errorf("unexpected %q after the flow collection", f.text[f.i:])
			}
		}
		if err != nil {
			return nil, p.errAt(l, "%v (flow collections must fit on one line)", err)
		}
		return v, nil
	case '"', '\'':
		s, rest, err := quoted(text)
		if err != nil {
			return nil, p.errAt(l, "%v", err)
		}
		if rest = strings.TrimSpace(rest); rest != "" && !strings.HasPrefix(rest, "#") {
			return nil, p.errAt(l, "unexpected %q after a quoted string", rest)
		}
		return s, nil
	case '&', '*', '!', '%', '@', '`':
		return nil, p.errAt(l, "%q: anchors, aliases, tags and directives are not in the YAML subset", text)
	}
	if i := strings.Index(text, " #"); i >= 0 {
		text = strings.TrimSpace(text[:i])
	}
	return plainScalar(text), nil
}

// blockScalar reads a literal (|) or folded (>) scalar; chomping "-" drops the final newline.
func (p *yamlParser) blockScalar(header string, l *yamlLine, parentIndent int) (interface{}, error) {
	if i := strings.Index(header, " #"); i >= 0 {
		header = strings.TrimSpace(header[:i])
	}
	style, chomp := header[0], header[1:]
	if chomp != "" && chomp != "-" && chomp != "+" {
		return nil, p.errAt(l, "unsupported block scalar header %q (use | |- |+ > >- >+)", header)
	}
	var body []string
	indent := -1
	for ; p.pos < len(p.lines); p.pos++ {
		raw := p.lines[p.pos]
		if raw.text == "" {
			body = append(body, "")
			continue
		}
		if indent < 0 {
			if raw.indent <= parentIndent {
				break
			}
			indent = raw.indent
		}
		if raw.indent < indent {
			break
		}
		body = append(body, strings.Repeat(" ", raw.indent-indent)+raw.text)
	}
	trailing := 0
	for len(body) > 0 && body[len(body)-1] == "" {
		body = body[:len(body)-1]
		trailing++
	}
	var text string
	if style == '|' {
		text = strings.Join(body, "\n")
	} else {
		text = foldLines(body)
	}
	switch {
	case len(body) == 0:
		text = ""
	case chomp == "-":
	case chomp == "+":
		text += strings.Repeat("\n", trailing+1)
	default:
		text += "\n"
	}
	return text, nil
}

// foldLines joins lines with spaces; blank lines and more-indented lines keep their breaks.
func foldLines(lines []string) string {
	var b strings.Builder
	for i, line := range lines {
		if i > 0 {
			prev := lines[i-1]
			switch {
			case line == "":
				b.WriteByte('\n') // each blank line is one line break
			case prev == "":
			case strings.HasPrefix(line, " ") || strings.HasPrefix(prev, " "):
				b.WriteByte('\n') // more-indented lines are kept as they are
			default:
				b.WriteByte(' ')
			}
		}
		b.WriteString(line)
	}
	return b.String()
}

// quoted reads a '...' or "..." scalar at the start of text and returns it and what follows.
func quoted(text string) (string, string, error) {
	q := text[0]
	var b strings.Builder
	for i := 1; i < len(text); i++ {
		c := text[i]
		switch {
		case q == '\'' && c == '\'':
			if i+1 < len(text) && text[i+1] == '\'' {
				b.WriteByte('\'')
				i++
				continue
			}
			return b.String(), text[i+1:], nil
		case q == '"' && c == '"':
			return b.String(), text[i+1:], nil
		case q == '"' && c == '\\':
			if i+1 >= len(text) {
				return "", "", fmt.Errorf("unterminated escape in %s", text)
			}
			i++
			switch e := text[i]; e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case '0':
				b.WriteByte(0)
			case '"', '\\', '/', ' ':
				b.WriteByte(e)
			case 'u', 'x':
				n := 4
				if e == 'x' {
					n = 2
				}
				if i+n >= len(text) {
					return "", "", fmt.Errorf("short \\%c escape in %s", e, text)
				}
				r, err := strconv.ParseUint(text[i+1:i+1+n], 16, 32)
				if err != nil {
					return "", "", fmt.Errorf("bad \\%c escape in %s", e, text)
				}
				b.WriteRune(rune(r))
				i += n
			default:
				return "", "", fmt.Errorf("unsupported escape \\%c in %s", e, text)
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("unterminated quoted string %s (quoted strings must end on their line)", text)
}

// plainScalar resolves an unquoted scalar like YAML 1.2's core schema, except that numbers
// with leading zeros (0755) stay strings rather than silently losing their zeros.
func plainScalar(text string) interface{} {
	switch text {
	case "", "~", "null", "Null", "NULL":
		return nil
	case "true", "True", "TRUE":
		return true
	case "false", "False", "FALSE":
		return false
	}
	switch {
	case yamlInt.MatchString(text):
		return json.Number(strings.TrimPrefix(text, "+"))
	case yamlFloat.MatchString(text):
		if f, err := strconv.ParseFloat(text, 64); err == nil {
			return json.Number(strconv.FormatFloat(f, 'g', -1, 64)) // ".5" is not a JSON number; "0.5" is
		}
	case yamlHexOct.MatchString(text):
		if n, err := strconv.ParseInt(text, 0, 64); err == nil {
			return json.Number(strconv.FormatInt(n, 10))
		}
	}
	return text
}

var (
	yamlInt    = regexp.MustCompile(`^[-+]?(0|[1-9][0-9]*)$`)
	yamlFloat  = regexp.MustCompile(`^[-+]?(0|[1-9][0-9]*)?\.[0-9]+([eE][-+]?[0-9]+)?$|^[-+]?(0|[1-9][0-9]*)[eE][-+]?[0-9]+$`)
	yamlHexOct = regexp.MustCompile(`^0x[0-9a-fA-F]+$|^0o[0-7]+$`)
)

// flowParser reads one-line flow collections: [a, "b", {k: v}].
type flowParser struct {
	text  string
	i     int
	depth int // starts at the block nesting it sits in; bounded by MaxDepth
}

func (f *flowParser) space() {
	for f.i < len(f.text) && f.text[f.i] == ' ' {
		f.i++
	}
}

func (f *flowParser) value() (interface{}, error) {
	f.space()
	if f.i >= len(f.text) {
		return nil, fmt.Errorf("unexpected end of line in a flow collection")
	}
	if c := f.text[f.i]; c == '[' || c == '{' {
		if f.depth++; f.depth > MaxDepth {
			return nil, fmt.Errorf("nested more than %d levels deep", MaxDepth)
		}
		defer func() { f.depth-- }()
	}
	switch f.text[f.i] {
	case '[':
		f.i++
		items := []interface{}{}
		for {
			f.space()
			if f.i < len(f.text) && f.text[f.i] == ']' {
				f.i++
				return items, nil
			}
			v, err := f.value()
			if err != nil {
				return nil, err
			}
			items = append(items, v)
			if err := f.separator(']'); err != nil {
				return nil, err
			}
		}
	case '{':
		f.i++
		m := map[string]interface{}{}
		for {
			f.space()
			if f.i < len(f.text) && f.text[f.i] == '}' {
				f.i++
				return m, nil
			}
			k, err := f.scalar(true)
			if err != nil {
				return nil, err
			}
			f.space()
			if f.i >= len(f.text) || f.text[f.i] != ':' {
				return nil, fmt.Errorf("expected ':' after key %v", k)
			}
			f.i++
			v, err := f.value()
			if err != nil {
				return nil, err
			}
			m[fmt.Sprint(k)] = v
			if err := f.separator('}'); err != nil {
				return nil, err
			}
		}
	}
	return f.scalar(false)
}

func (f *flowParser) separator(end byte) error {
	f.space()
	if f.i >= len(f.text) {
		return fmt.Errorf("missing %q", end)
	}
	switch f.text[f.i] {
	case ',':
		f.i++
		return nil
	case end:
		return nil
	}
	return fmt.Errorf("expected ',' or %q at %q", end, f.text[f.i:])
}

func (f *flowParser) scalar(isKey bool) (interface{}, error) {
	f.space()
	if f.i >= len(f.text) {
		return nil, fmt.Errorf("unexpected end of line in a flow collection")
	}
	if c := f.text[f.i]; c == '"' || c == '\'' {
		s, rest, err := quoted(f.text[f.i:])
		if err != nil {
			return nil, err
		}
		f.i = len(f.text) - len(rest)
		return s, nil
	}
	start := f.i
	for f.i < len(f.text) {
		c := f.text[f.i]
		if c == ',' || c == ']' || c == '}' || (isKey && c == ':') || (c == ':' && f.i+1 < len(f.text) && f.text[f.i+1] == ' ') {
			break
		}
		f.i++
	}
	text := strings.TrimSpace(f.text[start:f.i])
	if isKey {
		return text, nil
	}
	return plainScalar(text), nil
}
