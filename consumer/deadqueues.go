package consumer

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/dbbus"
	"github.com/bentoevents/bento/rabbitmq"
)

// rabbitDead is the dead-letter queues of a RabbitMQ broker.
type rabbitDead struct{ cfg *rabbitmq.Config }

func (r rabbitDead) browse(ctx context.Context, group string, verb deadVerb, pick func(*message.Message) (bool, bool)) (int, error) {
	var route rabbitmq.Route
	if verb == deadReplay {
		var err error
		if route, err = rabbitmq.GroupRoute(ctx, r.cfg, group); err != nil {
			return 0, err
		}
	}
	// The broker does with a message what the function said once it
	// returns: a message taken is done when the function is called for
	// the next one, or when the browse ends without an error.
	done, pending, stopped := 0, false, false
	err := rabbitmq.BrowseQueue(ctx, r.cfg, DeadLetterQueue(group), deadLimit, func(msg *message.Message) (rabbitmq.Browse, error) {
		if pending {
			done, pending = done+1, false
		}
		if stopped {
			return rabbitmq.Browse{}, nil
		}
		take, stop := pick(msg)
		stopped = stop
		switch {
		case !take:
			return rabbitmq.Browse{}, nil
		case verb == deadList:
			done++
			return rabbitmq.Browse{}, nil
		case verb == deadReplay:
			pending = true
			return rabbitmq.Browse{Republish: &route, Remove: true}, nil
		default:
			pending = true
			return rabbitmq.Browse{Remove: true}, nil
		}
	})
	if err == nil && pending {
		done++
	}
	return done, err
}

// databaseDead is the dead-letter queues of the database bus in db.
type databaseDead struct{ db *gorm.DB }

func (d databaseDead) browse(ctx context.Context, group string, verb deadVerb, pick func(*message.Message) (bool, bool)) (int, error) {
	if d.db == nil {
		return 0, fmt.Errorf("%w: DatabaseDeadLetters with a nil db", ErrInvalidConfig)
	}
	queue := DeadLetterQueue(group)
	if verb == deadList {
		n := 0
		err := dbbus.Peek(ctx, d.db, queue, deadLimit, func(b dbbus.Browsed) bool {
			take, stop := pick(b.Message)
			if take {
				n++
			}
			return !stop
		})
		return n, err
	}
	return dbbus.Browse(ctx, d.db, queue, deadLimit, func(b dbbus.Browsed) (dbbus.BrowseAction, error) {
		take, stop := pick(b.Message)
		a := dbbus.BrowseAction{Stop: stop}
		switch {
		case !take:
		case verb == deadReplay:
			// dbbus delivers it to the group alone.
			a.MoveTo = group
		default:
			a.Remove = true
		}
		return a, nil
	})
}
