package report

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"strings"
	texttemplate "text/template"
	"time"
)

//go:embed templates/index.html.tmpl
var htmlSource string

//go:embed templates/report.md.tmpl
var mdSource string

var funcs = template.FuncMap{
	"join":     strings.Join,
	"inc":      func(i int) int { return i + 1 },
	"dur":      fmtDur,
	"rate":     fmtRate,
	"int":      fmtInt,
	"secs":     fmtSeconds,
	"time":     func(t time.Time) string { return t.Format("2006-01-02 15:04:05 MST") },
	"runFiles": runFiles,
}

// fileLink is a link to one of a run's files.
type fileLink struct{ Href, Text string }

// runFiles are the links to a run's files that are beside the page.
func runFiles(p page, dashboard, dir string, metrics []string) []fileLink {
	var out []fileLink
	add := func(href, text string) {
		if p.Has(href) {
			out = append(out, fileLink{href, text})
		}
	}
	add(dashboard, "k6 dashboard")
	if dir != "" {
		add(dir+"/summary.txt", "summary")
		add(dir+"/summary.json", "summary.json")
		add(dir+"/k6.log", "k6 log")
	}
	for i, m := range metrics {
		add(m, fmt.Sprintf("/metrics i%d", i+1))
	}
	return out
}

var (
	htmlTemplate = template.Must(template.New("index.html").Funcs(funcs).Parse(htmlSource))
	// report.md shows choosing.md's table ("choicetable") too.
	mdTemplate = texttemplate.Must(texttemplate.Must(texttemplate.New("report.md").Funcs(texttemplate.FuncMap(funcs)).Parse(mdSource)).
			New(choosingFile).Parse(choosingSource)).Lookup("report.md")
)

//go:embed templates/choosing.md.tmpl
var choosingSource string

var choosingTemplate = texttemplate.Must(texttemplate.New("choosing.md").Funcs(texttemplate.FuncMap(funcs)).Parse(choosingSource))

// The files a report's folder holds beside its runs: the pages link each
// other, and the data, only where the file is there.
const (
	htmlFile     = "index.html"
	mdFile       = "report.md"
	choosingFile = "choosing.md"
)

// Exists tells whether a file a page would link, relative to the page's
// folder, is there. The pages link only what exists, so that a copy that
// leaves the runs' folders out (a published one) has no dead link.
type Exists func(rel string) bool

// InDir is Exists for the files of dir.
func InDir(dir string) Exists {
	return func(rel string) bool {
		if rel == "" || strings.Contains(rel, "://") {
			return false
		}
		_, err := os.Stat(filepath.Join(dir, filepath.FromSlash(rel)))
		return err == nil
	}
}

// WriteHTML renders the self-contained page. It links the files exists
// says are there (nil: none).
func WriteHTML(w io.Writer, r *Report, exists Exists) error {
	if err := htmlTemplate.Execute(w, buildPage(r, exists)); err != nil {
		return fmt.Errorf("report: html: %w", err)
	}
	return nil
}

// WriteMarkdown renders report.md: the same tables and facts, no charts.
func WriteMarkdown(w io.Writer, r *Report, exists Exists) error {
	if err := mdTemplate.Execute(w, buildPage(r, exists)); err != nil {
		return fmt.Errorf("report: markdown: %w", err)
	}
	return nil
}

// WriteChoosing renders choosing.md: the recommendation, its rules and
// where its figures come from. page is the report's index.html as seen
// from where choosing.md will be, for the links to the evidence;
// generatedBy, if set, is the command that wrote it.
func WriteChoosing(w io.Writer, r *Report, pageLink, generatedBy string) error {
	p := buildPage(r, nil)
	p.Page, p.GeneratedBy = pageLink, generatedBy
	if err := choosingTemplate.Execute(w, p); err != nil {
		return fmt.Errorf("report: choosing: %w", err)
	}
	return nil
}

// WriteFiles writes results.json.gz, then index.html, report.md and
// choosing.md into dir, each linking only the files dir holds.
func WriteFiles(dir string, r *Report) error {
	if err := r.Save(dir); err != nil {
		return err
	}
	return WritePages(dir, r)
}

// WritePages writes index.html, report.md and choosing.md into dir, from
// r as it is (results.json.gz is not written again).
func WritePages(dir string, r *Report) error {
	exists := InDir(dir)
	pages := []struct {
		name  string
		write func(io.Writer) error
	}{
		// choosing.md first: the others link it.
		{choosingFile, func(w io.Writer) error { return WriteChoosing(w, r, htmlFile, "") }},
		{mdFile, func(w io.Writer) error { return WriteMarkdown(w, r, exists) }},
		{htmlFile, func(w io.Writer) error { return WriteHTML(w, r, exists) }},
	}
	for _, pg := range pages {
		var buf bytes.Buffer
		if err := pg.write(&buf); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, pg.name), buf.Bytes(), 0o644); err != nil {
			return fmt.Errorf("report: %w", err)
		}
	}
	return nil
}
