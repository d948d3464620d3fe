package partition_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bentoevents/bento/partition"
)

func TestParseIntervalReadsWhatStringWrites(t *testing.T) {
	t.Parallel()
	for _, i := range []partition.Interval{partition.Daily, partition.Monthly} {
		got, err := partition.ParseInterval(i.String())
		require.NoError(t, err)
		assert.Equal(t, i, got)
	}
	for _, s := range []string{"", "none", "weekly", "Daily", partition.Interval(9).String()} {
		got, err := partition.ParseInterval(s)
		require.ErrorIs(t, err, partition.ErrUnknownInterval, "%q", s)
		assert.Equal(t, partition.None, got, "%q", s)
	}
}

func TestDefaultAheadCoversAWeekOrTwoMonths(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 7, partition.Daily.DefaultAhead())
	assert.Equal(t, 2, partition.Monthly.DefaultAhead())
}

func TestStepErrorNamesTheStepAndUnwraps(t *testing.T) {
	t.Parallel()
	cause := fmt.Errorf("%w: lock held", partition.ErrLockTimeout)
	err := fmt.Errorf("outbox: maintain: %w", &partition.StepError{
		Table: "outbox_events", Partition: "outbox_events_p20261101", Step: "drop", Err: cause,
	})
	var se *partition.StepError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "drop", se.Step)
	assert.Equal(t, "outbox_events_p20261101", se.Partition)
	assert.ErrorIs(t, err, partition.ErrLockTimeout)
	assert.False(t, errors.Is(err, partition.ErrNotPartitioned))
	assert.Contains(t, se.Error(), "outbox_events: drop partition outbox_events_p20261101")
}
