package dbbus

import (
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// messageKey names a message body: its UUID on a topic.
type messageKey struct{ id, topic string }

// readMessages reads the bodies of the message ids given, on every topic,
// as Watermill messages by key. A body whose metadata cannot be decoded
// is in unreadable instead, with the decoding error.
func readMessages(db *gorm.DB, ids []string) (msgs map[messageKey]*message.Message, unreadable map[messageKey]error, err error) {
	d, err := dialect.Of(db)
	if err != nil {
		return nil, nil, err
	}
	s := statementsFor(d)
	var bodies []struct {
		ID       string
		Topic    string
		Metadata string
		Payload  []byte
	}
	if err := db.Raw(s.readBodies, s.texts(ids)).Scan(&bodies).Error; err != nil {
		return nil, nil, err
	}
	msgs = make(map[messageKey]*message.Message, len(bodies))
	for _, b := range bodies {
		k := messageKey{b.ID, b.Topic}
		msg := message.NewMessage(b.ID, b.Payload)
		if err := json.Unmarshal([]byte(b.Metadata), &msg.Metadata); err != nil {
			if unreadable == nil {
				unreadable = map[messageKey]error{}
			}
			unreadable[k] = err
			continue
		}
		msgs[k] = msg
	}
	return msgs, unreadable, nil
}

// deleteOrphans deletes the bodies, of the message ids given, that no
// delivery references any more. On PostgreSQL the caller has locked them
// ([lockMessages]) in its transaction.
func deleteOrphans(tx *gorm.DB, ids []string) error {
	d, err := dialect.Of(tx)
	if err != nil {
		return err
	}
	s := statementsFor(d)
	return tx.Exec(s.deleteBodies, s.texts(ids)).Error
}
