package console

// RoutePatterns returns the patterns of c's routes, every page and action,
// in the order they are registered.
func RoutePatterns(c *Console) []string {
	out := make([]string, len(c.routes))
	for i, rt := range c.routes {
		out[i] = rt.pattern
	}
	return out
}
