package housekeeping

// Prepare returns cfg with its defaults filled in and the names of the jobs
// it enables, as Run sees them.
func Prepare(cfg *Config) (Config, []string, error) {
	m, err := newMetrics(nil)
	if err != nil {
		return Config{}, nil, err
	}
	c, jobs, err := prepare(cfg, m)
	names := make([]string, len(jobs))
	for i, j := range jobs {
		names[i] = j.name
	}
	return c, names, err
}
