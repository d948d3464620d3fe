package console

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/bentoevents/bento/outbox"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// pages holds one template set per page, each the layout plus the page's
// "content".
var pages = func() map[string]*template.Template {
	funcs := template.FuncMap{
		"pathEscape": url.PathEscape,
		"fmtTime":    fmtTime,
		"fmtAge":     fmtAge,
		"shortError": shortError,
		"backlogTable": func(id, label string, statuses []outbox.Status, rows []backlogRow) any {
			return struct {
				ID, Label string
				Statuses  []outbox.Status
				Rows      []backlogRow
				Cols      int
			}{id, label, statuses, rows, len(statuses) + 3}
		},
		"list": func(s ...string) []string { return s },
		"str": func(s *string) string {
			if s == nil {
				return ""
			}
			return *s
		},
		"timeOf": func(t *time.Time) time.Time {
			if t == nil {
				return time.Time{}
			}
			return *t
		},
	}
	out := map[string]*template.Template{}
	for _, name := range []string{"overview", "dead", "detail", "error", "consumers", "group", "groupdetail", "unroutable",
		"parked", "parkedaggregate", "members", "scheduled", "processes"} {
		out[name] = template.Must(template.New("layout.html").Funcs(funcs).
			ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	return out
}()

// page is what the layout needs; Data is the page's own content.
type page struct {
	Title      string // the console's title
	PageTitle  string
	Nav        string // "overview", "dead", "scheduled", "processes", "consumers" or "unroutable": the active tab
	Processes  bool   // the processes page has tables to show
	Consumers  bool   // the consumer dead-letter pages exist
	Unroutable bool   // the unroutable page exists
	Base       string // relative path back to the console's root
	ReadOnly   bool
	TenantLock string // Config.Tenant
	CSRF       string
	Flash      string
	Refresh    int // seconds; 0 for none
	Data       any
}

// newPage starts the page data for r.
func (c *Console) newPage(w http.ResponseWriter, r *http.Request, nav, title string, data any) *page {
	p := &page{
		Title: c.cfg.Title, PageTitle: title, Nav: nav, Base: relBase(r.URL.Path),
		ReadOnly: c.cfg.ReadOnly, TenantLock: c.cfg.Tenant, Data: data, Consumers: c.cfg.Consumers != nil,
		Unroutable: c.cfg.Unroutable != nil || c.cfg.UnroutableDB != nil, Processes: len(c.cfg.ProcessTables) > 0,
	}
	if !c.cfg.ReadOnly {
		p.CSRF = c.csrfToken(w, r)
	}
	return p
}

// render executes the page's template into a buffer first, so a template
// error becomes a 500 rather than half a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	var buf bytes.Buffer
	if err := pages[name].Execute(&buf, p); err != nil {
		c.cfg.Logger.ErrorContext(r.Context(), "console: render", "page", name, "err", err)
		http.Error(w, "console: cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// errorData is the content of the error page.
type errorData struct {
	Status  int
	Text    string
	Message string
}

// renderError answers with the error page: the status and msg, nothing else.
func (c *Console) renderError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	p := c.newPage(w, r, "", http.StatusText(status), &errorData{Status: status, Text: http.StatusText(status), Message: msg})
	c.render(w, r, status, "error", p)
}

// fail answers 500 for an error of the store, logging it. The page shows
// the error's message and nothing more.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	c.cfg.Logger.ErrorContext(r.Context(), "console: store error", "path", r.URL.Path, "err", err)
	c.renderError(w, r, http.StatusInternalServerError, "The outbox could not be read or changed: "+err.Error())
}

func (c *Console) notFound(w http.ResponseWriter, r *http.Request) {
	c.renderError(w, r, http.StatusNotFound, "There is no console page at this address.")
}

// static serves the embedded stylesheet.
func (c *Console) static(w http.ResponseWriter, r *http.Request) {
	name := strings.TrimPrefix(r.URL.Path, "/")
	if st, err := fs.Stat(staticFS, name); err != nil || st.IsDir() {
		c.notFound(w, r)
		return
	}
	http.ServeFileFS(w, r, staticFS, name)
}

// fmtTime formats an instant for the pages: UTC to the second.
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// fmtAge formats a duration the way operators read ages: the two largest
// units ("2d 3h", "4h 05m", "3m 07s", "12s").
func fmtAge(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	d = d.Round(time.Second)
	days, d := d/(24*time.Hour), d%(24*time.Hour)
	hours, d := d/time.Hour, d%time.Hour
	mins, d := d/time.Minute, d%time.Minute
	secs := d / time.Second
	switch {
	case days > 0:
		return fmt.Sprintf("%dd %dh", days, hours)
	case hours > 0:
		return fmt.Sprintf("%dh %02dm", hours, mins)
	case mins > 0:
		return fmt.Sprintf("%dm %02ds", mins, secs)
	default:
		return fmt.Sprintf("%ds", secs)
	}
}
