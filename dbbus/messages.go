package dbbus

import (
	"cmp"
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"

	"github.com/bentoevents/bento/internal/dialect"
)

// messageKey names a message body: its UUID on a topic.
type messageKey struct{ id, topic string }

// compareKeys orders keys by id, then topic: the order in which bodies are
// locked.
func compareKeys(a, b messageKey) int {
	return cmp.Or(cmp.Compare(a.id, b.id), cmp.Compare(a.topic, b.topic))
}

// readMessages reads the bodies of the messages keys names as Watermill
// messages by key (on SQLite, other topics' bodies of the same ids may come
// too). A body whose metadata cannot be decoded is in unreadable instead,
// with the decoding error.
func readMessages(db *gorm.DB, keys []messageKey) (msgs map[messageKey]*message.Message, unreadable map[messageKey]error, err error) {
	d, err := dialect.Of(db)
	if err != nil {
		return nil, nil, err
	}
	s := statementsFor(d)
	var bodies []body
	if err := db.Raw(s.readBodies, s.keys(keys)...).Scan(&bodies).Error; err != nil {
		return nil, nil, err
	}
	msgs, unreadable = decodeBodies(bodies)
	return msgs, unreadable, nil
}

// body is a stored message body.
type body struct {
	ID       string
	Topic    string
	Metadata string
	Payload  []byte
}

// decodeBodies makes stored bodies Watermill messages by key. A body whose
// metadata cannot be decoded is in unreadable instead, with the decoding
// error.
func decodeBodies(bodies []body) (msgs map[messageKey]*message.Message, unreadable map[messageKey]error) {
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
	return msgs, unreadable
}

// deleteOrphans deletes the bodies, of the messages keys names, that no
// delivery references any more. On PostgreSQL the caller has locked them
// ([lockMessages]) in its transaction.
func deleteOrphans(tx *gorm.DB, d dialect.Dialect, keys []messageKey) error {
	s := statementsFor(d)
	return tx.Exec(s.deleteBodies, s.keys(keys)...).Error
}
