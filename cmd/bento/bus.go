package main

import (
	"context"
	"flag"
	"strings"

	"gorm.io/gorm"

	"github.com/bentoevents/bento/consumer"
)

// Bus names, the values of --bus.
const (
	busAuto     = "auto"
	busRabbitMQ = "rabbitmq"
	busDatabase = "database"
)

// addBusFlag adds the --bus flag, which chooses where consumer groups'
// queues live.
func addBusFlag(fs *flag.FlagSet) *string {
	return fs.String("bus", busAuto, "where the groups' queues live: rabbitmq (AMQP_URL), database (the database bus in DATABASE_URL), or auto: rabbitmq when AMQP_URL is set, else database")
}

// resolveBus returns the bus --bus names, resolving auto.
func (c *cli) resolveBus(bus string) (string, error) {
	switch bus {
	case busRabbitMQ, busDatabase:
		return bus, nil
	case busAuto, "":
		switch {
		case strings.TrimSpace(c.getenv("AMQP_URL")) != "":
			return busRabbitMQ, nil
		case strings.TrimSpace(c.getenv("DATABASE_URL")) == "":
			return "", usagef("neither AMQP_URL nor DATABASE_URL is set: set AMQP_URL for RabbitMQ, or DATABASE_URL for the database bus")
		}
		return busDatabase, nil
	}
	return "", usagef("bad --bus %q: want rabbitmq, database or auto", bus)
}

// deadLetters returns the consumer groups' dead letters on the bus --bus
// chooses (exchange is the value of fs's flag "exchange", for RabbitMQ),
// and the function that closes what it opened.
func (c *cli) deadLetters(ctx context.Context, fs *flag.FlagSet, bus, exchange string) (*consumer.DeadLetters, func(), error) {
	bus, err := c.resolveBus(bus)
	if err != nil {
		return nil, nil, err
	}
	if bus == busRabbitMQ {
		cfg, err := c.amqpConfig(fs, exchange)
		if err != nil {
			return nil, nil, err
		}
		return consumer.RabbitMQDeadLetters(cfg), func() {}, nil
	}
	db, err := c.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	dead, err := databaseDeadLetters(db)
	if err != nil {
		closeAll(db)
		return nil, nil, err
	}
	return dead, func() { closeAll(db) }, nil
}

// databaseDeadLetters returns the dead letters of the database bus in db,
// once it checked that the bus's tables exist.
func databaseDeadLetters(db *gorm.DB) (*consumer.DeadLetters, error) {
	if !db.Migrator().HasTable("dbbus_deliveries") {
		return nil, usagef("the database bus's tables (dbbus_deliveries) do not exist in DATABASE_URL: for groups on RabbitMQ set AMQP_URL (or --bus rabbitmq)")
	}
	return consumer.DatabaseDeadLetters(db), nil
}
