package main

import (
	"errors"
	"sync"
)

// runWorkers runs workers goroutines that take jobs and call do for each,
// until jobs is closed. A worker stops at its first error; the jobs left
// are then drained, so that their producer ends, and the errors joined.
func runWorkers[J any](workers int, jobs <-chan J, do func(J) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := do(j); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	for range jobs { // drain the producer if every worker stopped early
	}
	return errors.Join(errs...)
}
