package dbbus

import (
	"encoding/json"

	"github.com/ThreeDotsLabs/watermill/message"
	"gorm.io/gorm"
)

// messageKey names a message body: its UUID on a topic.
type messageKey struct{ id, topic string }

// readMessages reads the bodies of the message ids given, on every topic,
// as Watermill messages by key. A body whose metadata cannot be decoded
// is in unreadable instead, with the decoding error.
func readMessages(db *gorm.DB, ids []string) (msgs map[messageKey]*message.Message, unreadable map[messageKey]error, err error) {
	var bodies []struct {
		ID       string
		Topic    string
		Metadata string
		Payload  []byte
	}
	if err := db.Raw(readBodies, ids).Scan(&bodies).Error; err != nil {
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
