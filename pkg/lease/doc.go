// Package lease elects one leader among the replicas of a service through a
// key in a JetStream key-value bucket whose TTL drops the key when nobody
// renews it. The scheduler and the supervisor each hold their own key.
package lease
