// Command lumber_send is a Lumberjack v2 load generator built on go-lumber's
// client/v2, the library the Beats' Logstash output sends with.
//
// It takes the flags of go-lumber's own cmd/tst-send and behaves the same way:
// one connection to -c, one batch of -batch events sent again and again until
// the process is killed, -pipeline windows in flight (the asynchronous client;
// 0 selects the synchronous one, one window at a time), zlib level -compress
// for the window's compressed frame (0: plain JSON frames), -timeout for the
// connection's reads and writes, and an HTTP server on -httpprof serving
// expvar, whose "ACKed" counter at /debug/vars holds the events of the
// windows the server has acknowledged in full.
//
// The events are of the same kind as tst-send's: "@timestamp" (the time they
// were made, in the RFC 3339 form with nanoseconds that Go's time.Time
// marshals to), "type": "filebeat", a random line of lorem ipsum as "message"
// and "offset": 1000. What differs is the encoding: tst-send hands the library
// maps that encoding/json walks by reflection for every window, which costs
// more CPU than a fast receiver spends on them. Beats give go-lumber their own
// encoder (the v2.JSONEncoder option) instead. Here every event is encoded
// once, at start-up, and the encoder given to the client returns those bytes
// as they are, so what each window costs this process is the library's own
// work: the frames, the zlib stream and the socket.
//
// Usage:
//
//	lumber_send -c 127.0.0.1:5044 -batch 2048 -pipeline 2 -compress 3
package main

import (
	"encoding/json"
	"expvar"
	"flag"
	"fmt"
	"log"
	"math/rand"
	"net/http"
	"os"
	"strings"
	"time"

	v2 "github.com/elastic/go-lumber/client/v2"
)

// loremLines are the messages, one picked at random per event.
var loremLines = strings.Split(strings.TrimSpace(`
Lorem ipsum dolor sit amet, consetetur sadipscing elitr,
sed diam nonumy eirmod tempor invidunt ut labore et dolore magna aliquyam erat,
sed diam voluptua. At vero eos et accusam et justo duo dolores et ea rebum. Stet
clita kasd gubergren, no sea takimata sanctus est Lorem ipsum dolor sit amet.
Lorem ipsum dolor sit amet, consetetur sadipscing elitr, sed diam nonumy eirmod
tempor invidunt ut labore et dolore magna aliquyam erat, sed diam voluptua. At
vero eos et accusam et justo duo dolores et ea rebum. Stet clita kasd gubergren,
no sea takimata sanctus est Lorem ipsum dolor sit amet.`), "\n")

// event has the fields of a tst-send event, in the order encoding/json writes
// a map's keys (sorted), so that the documents come out byte for byte alike.
type event struct {
	Timestamp time.Time `json:"@timestamp"`
	Message   string    `json:"message"`
	Offset    int       `json:"offset"`
	Type      string    `json:"type"`
}

// encodedBatch makes size events and encodes each of them once.
func encodedBatch(size int) ([]interface{}, error) {
	batch := make([]interface{}, size)
	for i := range batch {
		doc, err := json.Marshal(event{
			Timestamp: time.Now(),
			Message:   loremLines[rand.Intn(len(loremLines))],
			Offset:    1000,
			Type:      "filebeat",
		})
		if err != nil {
			return nil, err
		}
		batch[i] = json.RawMessage(doc)
	}
	return batch, nil
}

// preEncoded is the client's JSON encoder: it hands back the bytes encoded at
// start-up. Anything else is encoded the ordinary way (this program passes
// nothing else).
func preEncoded(v interface{}) ([]byte, error) {
	switch doc := v.(type) {
	case json.RawMessage:
		return doc, nil
	case []byte:
		return doc, nil
	default:
		return json.Marshal(v)
	}
}

func main() {
	address := flag.String("c", "localhost:5044", "address of the Lumberjack v2 server")
	level := flag.Int("compress", 3, "zlib compression level of the windows (0-9, 0: uncompressed)")
	timeout := flag.Duration("timeout", 30*time.Second, "read and write timeout of the connection")
	size := flag.Int("batch", 2048, "events per window")
	inflight := flag.Int("pipeline", 0, "windows kept in flight (0: synchronous, wait for each ACK)")
	httpAddr := flag.String("httpprof", ":6060", "address of the HTTP server (expvar at /debug/vars)")
	flag.Parse()
	if *size < 1 {
		fmt.Fprintln(os.Stderr, "-batch must be at least 1")
		os.Exit(2)
	}

	acked := expvar.NewInt("ACKed")
	batch, err := encodedBatch(*size)
	if err != nil {
		log.Fatalf("encoding the events: %v", err)
	}
	n := int64(len(batch))

	go func() {
		log.Printf("HTTP server on %v", *httpAddr)
		if err := http.ListenAndServe(*httpAddr, nil); err != nil {
			log.Printf("HTTP server: %v", err)
		}
	}()

	opts := []v2.Option{
		v2.CompressionLevel(*level),
		v2.Timeout(*timeout),
		v2.JSONEncoder(preEncoded),
	}
	log.Printf("connecting to %v", *address)

	if *inflight == 0 {
		client, err := v2.SyncDial(*address, opts...)
		if err != nil {
			log.Fatal(err)
		}
		for {
			if _, err := client.Send(batch); err != nil {
				log.Println(err)
				return
			}
			acked.Add(n)
		}
	}

	client, err := v2.AsyncDial(*address, *inflight, opts...)
	if err != nil {
		log.Fatal(err)
	}
	done := func(_ uint32, err error) {
		if err != nil {
			log.Println(err)
			return
		}
		acked.Add(n)
	}
	for {
		if err := client.Send(done, batch); err != nil {
			log.Println(err)
			return
		}
	}
}
