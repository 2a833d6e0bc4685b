// A small go-nsq (github.com/nsqio/go-nsq, unmodified) consumer and producer for
// scripts/clients/gonsq_failover.py. Not part of the Rust build; built by hand with
// a Go toolchain and go-nsq + golang/snappy sources (see gonsq_failover.py's docstring).
//
//	gonsq_client sub -lookupd HOST:PORT -topic T -channel C [-poll 60s] [-max-in-flight 50]
//	    prints every message body received on its own line on stdout and FINs it
//	    (go-nsq's own log lines go to stderr).
//	gonsq_client pub -nsqd HOST:PORT[,HOST:PORT...] -topic T
//	    reads bodies, one a line, from stdin; publishes each through the first member
//	    that answers OK (trying the others in turn, for 30 s at most per body) and
//	    prints "ACK <body> <member>" on stdout; exit status 1 if a body got no OK.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nsqio/go-nsq"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gonsq_client sub|pub [flags]")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "sub":
		sub(os.Args[2:])
	case "pub":
		pub(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "usage: gonsq_client sub|pub [flags]")
		os.Exit(2)
	}
}

func sub(args []string) {
	fs := flag.NewFlagSet("sub", flag.ExitOnError)
	lookupd := fs.String("lookupd", "", "nsqlookupd HTTP address")
	topic := fs.String("topic", "", "topic")
	channel := fs.String("channel", "gonsq", "channel")
	poll := fs.Duration("poll", 60*time.Second, "lookupd_poll_interval (go-nsq default 60s)")
	mif := fs.Int("max-in-flight", 50, "max in flight")
	fs.Parse(args)
	cfg := nsq.NewConfig()
	cfg.LookupdPollInterval = *poll
	cfg.MaxInFlight = *mif
	c, err := nsq.NewConsumer(*topic, *channel, cfg)
	if err != nil {
		log.Fatal(err)
	}
	c.SetLogger(log.New(os.Stderr, "[go-nsq] ", log.LstdFlags|log.Lmicroseconds), nsq.LogLevelInfo)
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	c.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		mu.Lock()
		out.Write(m.Body)
		out.WriteByte('\n')
		out.Flush()
		mu.Unlock()
		return nil // go-nsq FINs the message
	}))
	if err := c.ConnectToNSQLookupd(*lookupd); err != nil {
		log.Fatal(err)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-sig:
		c.Stop()
		select {
		case <-c.StopChan:
		case <-time.After(5 * time.Second):
		}
	case <-c.StopChan:
	}
}

func pub(args []string) {
	fs := flag.NewFlagSet("pub", flag.ExitOnError)
	nsqd := fs.String("nsqd", "", "comma-separated nsqd TCP addresses")
	topic := fs.String("topic", "", "topic")
	fs.Parse(args)
	var producers []*nsq.Producer
	var addrs []string
	for _, a := range strings.Split(*nsqd, ",") {
		p, err := nsq.NewProducer(a, nsq.NewConfig())
		if err != nil {
			log.Fatal(err)
		}
		p.SetLogger(log.New(os.Stderr, "[go-nsq] ", log.LstdFlags|log.Lmicroseconds), nsq.LogLevelWarning)
		producers = append(producers, p)
		addrs = append(addrs, a)
	}
	in := bufio.NewScanner(os.Stdin)
	failed := false
	for in.Scan() {
		body := in.Text()
		deadline := time.Now().Add(30 * time.Second)
		ok := false
		for !ok && time.Now().Before(deadline) {
			for i, p := range producers {
				if err := p.Publish(*topic, []byte(body)); err != nil {
					fmt.Fprintf(os.Stderr, "publish %s via %s: %s\n", body, addrs[i], err)
					continue
				}
				fmt.Printf("ACK %s %s\n", body, addrs[i])
				ok = true
				break
			}
			if !ok {
				time.Sleep(100 * time.Millisecond)
			}
		}
		if !ok {
			fmt.Fprintf(os.Stderr, "no member acknowledged %s\n", body)
			failed = true
		}
	}
	for _, p := range producers {
		p.Stop()
	}
	if failed {
		os.Exit(1)
	}
}
